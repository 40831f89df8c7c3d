#include "common/net.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "common/unique_fd.h"

namespace ddprun {

std::string hostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

int findFreePort(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* results = nullptr;
  int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), "0", &hints, &results);
  if (rc != 0) throw ConnectionError("cannot resolve '" + host + "': " + ::gai_strerror(rc));
  std::string lastError = "no address";
  for (addrinfo* ai = results; ai; ai = ai->ai_next) {
    UniqueFd sock(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!sock) continue;
    if (::bind(sock.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      lastError = std::strerror(errno);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof(bound);
    if (::getsockname(sock.get(), reinterpret_cast<sockaddr*>(&bound), &len) != 0) continue;
    int port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                           : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    ::freeaddrinfo(results);
    return port;
  }
  ::freeaddrinfo(results);
  throw ConnectionError("cannot bind a port on '" + host + "': " + lastError);
}

}  // namespace ddprun
