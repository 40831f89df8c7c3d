#include "netguard/tls_termination.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

namespace ddprun {

ssize_t TlsTermination::receive(int fd, char* out, std::size_t capacity, bool* heard) {
  for (;;) {
    std::size_t got = 0;
    const auto result = session_->read(out, capacity, &got);
    session_->takeOutput(cipherOut_.bytes);
    switch (result) {
      case TlsSession::Result::kData: return static_cast<ssize_t>(got);
      case TlsSession::Result::kClosed: return 0;
      case TlsSession::Result::kFailed: errno = EPROTO; return -1;
      case TlsSession::Result::kWantMore: break;
    }
    char raw[16 * 1024 + 256];  // a TLS record and its overhead
    const ssize_t n = ::recv(fd, raw, sizeof(raw), 0);
    if (n <= 0) return n;
    *heard = true;
    session_->feed(raw, static_cast<std::size_t>(n));
  }
}

bool TlsTermination::send(int fd, RelayBuffer& plaintext, bool* progress) {
  while (plaintext.size() > 0 && cipherOut_.size() < kRelayBufferBytes && established()) {
    const std::size_t n =
        session_->write(plaintext.bytes.data() + plaintext.start, std::min<std::size_t>(plaintext.size(), 16384));
    if (n == 0) break;
    plaintext.consumed(n);
    session_->takeOutput(cipherOut_.bytes);
  }
  session_->takeOutput(cipherOut_.bytes);
  return writeBuffered(fd, cipherOut_, progress);
}

void TlsTermination::flush(int fd) {
  bool progress = false;
  session_->takeOutput(cipherOut_.bytes);
  writeBuffered(fd, cipherOut_, &progress);
}

bool TlsTermination::closeNotify(int fd) {
  if (!closeNotifySent_) {
    closeNotifySent_ = true;
    session_->shutdown();
    session_->takeOutput(cipherOut_.bytes);
    bool progress = false;
    writeBuffered(fd, cipherOut_, &progress);
  }
  return cipherOut_.size() == 0;
}

}  // namespace ddprun
