// TLS terminated on the client's side of a relayed connection (connection_relay.h, README
// "Security"): the client's socket carries ciphertext, the relay's buffers plaintext, so that the
// frame limits count the decrypted HTTP/2 frames. It owns the TLS session and the ciphertext on
// its way to the client; the relay owns the socket, the plaintext and when to read or write.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <memory>
#include <string>

#include "netguard/relay_buffer.h"
#include "tls/tls_session.h"

namespace ddprun {

class TlsTermination {
 public:
  explicit TlsTermination(std::unique_ptr<TlsSession> session) : session_(std::move(session)) {}

  bool established() const { return session_->established(); }
  // Records are left inside OpenSSL (no socket event will come for them): read again.
  bool mayHaveMore() const { return session_->mayHaveMore(); }
  // Why the session failed; empty while it has not.
  const std::string& error() const { return session_->error(); }

  // Plaintext from socket `fd`, as recv(2) returns it (0: the end; -1 with errno: EPROTO when TLS
  // failed): reads ciphertext until a record decrypts, queueing the handshake's replies on the
  // way. `*heard` is set when the socket gave bytes (the handshake is not stalled).
  ssize_t receive(int fd, char* out, std::size_t capacity, bool* heard);
  // Encrypts what `plaintext` holds, only as much as the ciphertext buffer takes (a client that
  // does not read slows gRPC), and writes the ciphertext (the handshake's replies too). False
  // when the write failed.
  bool send(int fd, RelayBuffer& plaintext, bool* progress);
  // Whether anything waits to be written to the client now.
  bool wantsWrite(const RelayBuffer& plaintext) const {
    return cipherOut_.size() > 0 || (plaintext.size() > 0 && established());
  }
  // Writes what OpenSSL queued (an alert before a close), best effort.
  void flush(int fd);
  // Queues close_notify (once) and writes it: true when no ciphertext is left to write, so that
  // the FIN may follow.
  bool closeNotify(int fd);

 private:
  std::unique_ptr<TlsSession> session_;
  RelayBuffer cipherOut_;
  bool closeNotifySent_ = false;
};

}  // namespace ddprun
