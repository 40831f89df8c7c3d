// The server side of ddprun's TLS: an OpenSSL context made from PEM files. The connection relay
// terminates TLS with it in front of gRPC (netguard/connection_relay.h), because the relay must
// read the HTTP/2 frames that TLS hides (docs/rendezvous.md, "TLS").
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "tls/tls_options.h"

typedef struct ssl_ctx_st SSL_CTX;

namespace ddprun {

class TlsServerContext {
 public:
  // Reads the files now. Throws ConfigError naming the file and OpenSSL's reason (unreadable, not
  // PEM, the key does not match the certificate, ...).
  explicit TlsServerContext(TlsServerOptions options);
  ~TlsServerContext();
  TlsServerContext(const TlsServerContext&) = delete;
  TlsServerContext& operator=(const TlsServerContext&) = delete;

  // Reads the files again (SIGHUP: certificate rotation). Connections made afterwards use the new
  // ones; open ones keep what they were made with. On error, throws ConfigError and keeps the old.
  void reload();
  // The context new connections use (an OpenSSL reference: the caller owns one, freed by the
  // shared_ptr). From any thread.
  std::shared_ptr<SSL_CTX> current() const;
  bool requiresClientCertificate() const { return !options_.clientCaFile.empty(); }
  const TlsServerOptions& options() const { return options_; }

 private:
  const TlsServerOptions options_;
  mutable std::mutex mu_;
  std::shared_ptr<SSL_CTX> ctx_;
};

// OpenSSL's queued errors as one line ("error:0A000086:SSL routines::certificate verify failed"),
// and clears the queue; `fallback` when there is none.
std::string takeOpenSslErrors(const std::string& fallback = "unknown TLS error");

}  // namespace ddprun
