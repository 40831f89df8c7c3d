#include "netguard/relay_buffer.h"

#include <sys/socket.h>

#include <cerrno>

namespace ddprun {

bool writeBuffered(int fd, RelayBuffer& out, bool* progress) {
  while (out.size() > 0) {
    const ssize_t n = ::send(fd, out.bytes.data() + out.start, out.size(), MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK;
    }
    *progress = true;
    out.consumed(static_cast<std::size_t>(n));
  }
  return true;
}

}  // namespace ddprun
