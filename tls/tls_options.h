// What TLS a ddprun channel or server uses (README "Security"): PEM files, always by path, never
// by value in an environment variable or on a command line.
#pragma once

#include <string>
#include <vector>

namespace ddprun {

// An agent's or a worker's side (--rdzv_conf protocol=https,cacert=...,cert=...,key=...).
struct TlsClientOptions {
  bool enabled = false;
  std::string caCertFile;  // the CA the server's certificate must chain to; empty: gRPC's roots
  std::string certFile;    // this node's certificate, for mTLS; empty: none
  std::string keyFile;     // its private key
};

// A server's side (ddprun-rdzv --tls_cert/--tls_key/--tls_client_ca/--tls_allowed_names, or an
// agent that hosts its job's rendezvous: server_cert/server_key).
struct TlsServerOptions {
  std::string certFile;
  std::string keyFile;
  // Require a client certificate signed by this CA (mTLS); empty: none asked for.
  std::string clientCaFile;
  // With mTLS: a client certificate must name one of these (shell patterns, fnmatch(3), matched
  // against its subject's common name and each DNS, URI and e-mail subject alternative name).
  // Empty: any certificate the CA signed.
  std::vector<std::string> allowedNames;
};

// The start of the reason a TLS server gives a plaintext client before it closes the connection
// (an HTTP/2 GOAWAY): the client's agent recognizes it and exits 2 saying so.
inline constexpr const char* kTlsRequiredReason = "this server requires TLS";

}  // namespace ddprun
