// findFreePort (common/net.h) on real sockets: MASTER_PORT comes from below the kernel's ephemeral
// range, where no outgoing connection of the machine can take it before the worker binds it.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <set>

#include "common/net.h"

namespace {

// Binds 127.0.0.1:port; the socket is returned (bound) or -1.
int bindLoopback(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

TEST_CASE("findFreePort: a port below the ephemeral range, free to bind, not the same every time", "[net]") {
  const int start = ddprun::ephemeralPortStart();
  REQUIRE(start > 11000);  // Linux's default is 32768; a machine with a wider range falls back to port 0
  std::set<int> seen;
  for (int i = 0; i < 8; ++i) {
    int port = ddprun::findFreePort("127.0.0.1");
    CHECK(port >= 10000);
    CHECK(port < start);
    int fd = bindLoopback(port);
    CHECK(fd >= 0);
    if (fd >= 0) ::close(fd);
    seen.insert(port);
  }
  CHECK(seen.size() > 1);
}

TEST_CASE("findFreePort: a taken port is passed over, a range with nothing free falls back to port 0", "[net]") {
  int held = ddprun::findFreePort("127.0.0.1");
  int fd = bindLoopback(held);
  REQUIRE(fd >= 0);
  REQUIRE(::listen(fd, 1) == 0);
  const int start = ddprun::ephemeralPortStart();
  // The only port of the range is taken: the kernel's pick (port 0), in the ephemeral range.
  int fallback = ddprun::findFreePort("127.0.0.1", held, held + 1);
  CHECK(fallback != held);
  CHECK(fallback >= start);
  // Two ports, one taken: the other, whichever is picked first.
  int next = ddprun::findFreePort("127.0.0.1", held, held + 2);
  CHECK(next != held);
  if (next != held + 1) CHECK(next >= start);  // held + 1 was in use by someone else: the fallback
  ::close(fd);
}
