// One server-side TLS connection over memory buffers: the relay moves the ciphertext on its own
// sockets (non-blocking, one thread for every connection) and OpenSSL only encrypts and decrypts.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "tls/server_context.h"

typedef struct ssl_st SSL;
typedef struct bio_st BIO;

namespace ddprun {

class TlsSession {
 public:
  explicit TlsSession(const std::shared_ptr<SSL_CTX>& context);
  ~TlsSession();
  TlsSession(const TlsSession&) = delete;
  TlsSession& operator=(const TlsSession&) = delete;

  // Ciphertext that arrived from the client.
  void feed(const char* data, std::size_t n);
  // Whether records may wait inside OpenSSL: the last read() returned data (it decrypts one record
  // at a time, and one feed can hold several). False once a read() wanted more ciphertext.
  bool mayHaveMore() const { return mayHaveMore_; }

  enum class Result { kData, kWantMore, kClosed, kFailed };
  // Decrypts up to `capacity` bytes into `out` (*got: how many), driving the handshake first.
  // kWantMore: feed more ciphertext. kClosed: the client said close_notify. kFailed: error().
  Result read(char* out, std::size_t capacity, std::size_t* got);
  // Encrypts up to n bytes of plaintext once the handshake is done; returns how many it took.
  std::size_t write(const char* data, std::size_t n);
  // Appends the ciphertext to send (handshake messages, records, alerts) to `out`.
  void takeOutput(std::vector<char>& out);
  // Queues close_notify (then takeOutput).
  void shutdown();

  bool established() const;
  // Why the session failed, in words ("certificate verify failed: ...", "wrong version number").
  const std::string& error() const { return error_; }
  // The client certificate's names (name_match.h), for logs; empty without one.
  std::string peerNames() const;

 private:
  SSL* ssl_ = nullptr;
  BIO* in_ = nullptr;   // owned by ssl_
  BIO* out_ = nullptr;  // owned by ssl_
  std::string error_;
  bool mayHaveMore_ = false;
};

}  // namespace ddprun
