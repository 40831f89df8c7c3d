#include "worker_sdk/source_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

#include "common/unique_fd.h"

namespace ddp::detail {

namespace {

std::optional<std::string> toText(const sockaddr_storage& address) {
  char text[INET6_ADDRSTRLEN] = {};
  const void* addr = address.ss_family == AF_INET6
                         ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(&address)->sin6_addr)
                         : static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(&address)->sin_addr);
  if (!::inet_ntop(address.ss_family, addr, text, sizeof(text))) return std::nullopt;
  return std::string(text);
}

}  // namespace

std::optional<std::string> sourceAddressToward(const std::string& host, int port) {
  if (host.empty()) return std::nullopt;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* results = nullptr;
  const std::string service = std::to_string(port > 0 ? port : 9);
  if (::getaddrinfo(host.c_str(), service.c_str(), &hints, &results) != 0) return std::nullopt;
  std::optional<std::string> found;
  for (addrinfo* ai = results; ai && !found; ai = ai->ai_next) {
    ddprun::UniqueFd sock(::socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (!sock || ::connect(sock.get(), ai->ai_addr, ai->ai_addrlen) != 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (::getsockname(sock.get(), reinterpret_cast<sockaddr*>(&local), &len) != 0) continue;
    found = toText(local);
  }
  ::freeaddrinfo(results);
  return found;
}

std::optional<std::string> numericAddress(const std::string& host) {
  if (host.empty()) return std::nullopt;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* results = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &results) != 0 || !results) return std::nullopt;
  sockaddr_storage address{};
  std::memcpy(&address, results->ai_addr, std::min<std::size_t>(results->ai_addrlen, sizeof(address)));
  ::freeaddrinfo(results);
  return toText(address);
}

}  // namespace ddp::detail
