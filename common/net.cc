#include "common/net.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>

#include "common/error.h"
#include "common/strings.h"
#include "common/unique_fd.h"

namespace ddprun {

std::string hostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

namespace {

// Binds `port` (0: any) on every address `host` resolves to, in turn, until one binds; returns the
// bound port, or 0 with `error` set.
int bindPort(const std::string& host, int port, std::string* error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* results = nullptr;
  const std::string service = std::to_string(port);
  int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &results);
  if (rc != 0) throw ConnectionError("cannot resolve '" + host + "': " + ::gai_strerror(rc));
  *error = "no address";
  for (addrinfo* ai = results; ai; ai = ai->ai_next) {
    UniqueFd sock(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!sock) continue;
    if (::bind(sock.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      *error = std::strerror(errno);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof(bound);
    if (::getsockname(sock.get(), reinterpret_cast<sockaddr*>(&bound), &len) != 0) continue;
    int got = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                          : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    ::freeaddrinfo(results);
    return got;
  }
  ::freeaddrinfo(results);
  return 0;
}

}  // namespace

int ephemeralPortStart() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0;
  if (in >> low && low > 0 && low <= 65535) return low;
  return 32768;
}

int findFreePort(const std::string& host) {
  constexpr int kLowest = 10000;  // below: well-known and registered services
  const int start = ephemeralPortStart();
  return start > kLowest + 1000 ? findFreePort(host, kLowest, start) : findFreePort(host, 0, 0);
}

int findFreePort(const std::string& host, int low, int high) {
  std::string error;
  if (low > 0 && high > low && high <= 65536) {
    std::mt19937 rng(std::random_device{}());
    std::uniform_int_distribution<int> pick(low, high - 1);
    const int attempts = std::min(64, 2 * (high - low));
    for (int attempt = 0; attempt < attempts; ++attempt) {
      if (int port = bindPort(host, pick(rng), &error)) return port;
    }
  }
  if (int port = bindPort(host, 0, &error)) return port;
  throw ConnectionError("cannot bind a port on '" + host + "': " + error);
}

std::string joinHostPort(const std::string& host, int port) {
  bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

std::pair<std::string, int> parseEndpoint(const std::string& endpoint, int defaultPort) {
  std::string host = endpoint;
  std::string portText;
  bool hasPort = false;
  if (!endpoint.empty() && endpoint[0] == '[') {
    auto close = endpoint.find(']');
    if (close == std::string::npos) throw ConfigError("endpoint '" + endpoint + "': missing ']'");
    host = endpoint.substr(1, close - 1);
    std::string rest = endpoint.substr(close + 1);
    if (!rest.empty()) {
      if (rest[0] != ':') throw ConfigError("endpoint '" + endpoint + "': expected :PORT after ']'");
      portText = rest.substr(1);
      hasPort = true;
    }
  } else if (std::count(endpoint.begin(), endpoint.end(), ':') == 1) {
    auto colon = endpoint.find(':');
    host = endpoint.substr(0, colon);
    portText = endpoint.substr(colon + 1);
    hasPort = true;
  }
  if (host.empty()) throw ConfigError("endpoint '" + endpoint + "': missing host");
  int port = defaultPort;
  if (hasPort) {
    auto parsed = parseInt(portText);
    if (!parsed || *parsed < 0 || *parsed > 65535) throw ConfigError("endpoint '" + endpoint + "': bad port");
    port = static_cast<int>(*parsed);
  }
  return {host, port};
}

namespace {

// The address as 16 bytes of IPv6, IPv4 mapped into it; nullopt for anything else.
std::optional<std::array<unsigned char, 16>> ipBytes(const std::string& text) {
  if (text.find('\0') != std::string::npos) return std::nullopt;  // inet_pton would stop at it
  std::array<unsigned char, 16> out{};
  in_addr v4{};
  if (::inet_pton(AF_INET, text.c_str(), &v4) == 1) {
    out[10] = out[11] = 0xff;
    std::memcpy(out.data() + 12, &v4, 4);
    return out;
  }
  in6_addr v6{};
  if (::inet_pton(AF_INET6, text.c_str(), &v6) == 1) {
    std::memcpy(out.data(), &v6, 16);
    return out;
  }
  return std::nullopt;
}

}  // namespace

std::optional<bool> sameAddress(const std::string& a, const std::string& b) {
  auto x = ipBytes(a);
  auto y = ipBytes(b);
  if (!x || !y) return std::nullopt;
  return *x == *y;
}

}  // namespace ddprun
