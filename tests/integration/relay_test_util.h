// Sockets for the connection relay's tests (connection_relay_test.cc, tls_relay_test.cc): a socket
// pair for the client's connection, blocking reads and writes with the safety bound, and HTTP/2
// frames.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <string>

#include "common/unique_fd.h"
#include "safety_bound.h"

namespace ddprun::test {

struct Pair {
  UniqueFd test;   // the client's end, driven by the test
  UniqueFd relay;  // given to the relay as the "client connection"
};

inline Pair makePair() {
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
  return {UniqueFd(fds[0]), UniqueFd(fds[1])};
}

// Writes all of `data` (waiting out EAGAIN on a non-blocking descriptor); false when the
// descriptor broke (checked by the caller: no REQUIRE in threads).
inline bool writeAll(int fd, const std::string& data) {
  std::size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 100);
      continue;
    }
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

// Reads until `want` bytes came or EOF (*eof); fails the test after the safety bound.
inline std::string readUpTo(int fd, std::size_t want, bool* eof = nullptr) {
  std::string out;
  const auto deadline = std::chrono::steady_clock::now() + kSafetyBound;
  while (out.size() < want) {
    pollfd p{fd, POLLIN, 0};
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    if (::poll(&p, 1, 100) <= 0) continue;
    char buf[65536];
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n <= 0) {
      if (eof) *eof = true;
      break;
    }
    out.append(buf, static_cast<std::size_t>(n));
  }
  return out;
}

// An HTTP/2 frame of `type` on `stream` with `payload` bytes of filler.
inline std::string frame(unsigned char type, uint32_t stream, std::size_t payload) {
  std::string f{static_cast<char>(payload >> 16), static_cast<char>(payload >> 8), static_cast<char>(payload),
                static_cast<char>(type), 0, static_cast<char>(stream >> 24), static_cast<char>(stream >> 16),
                static_cast<char>(stream >> 8), static_cast<char>(stream)};
  f.append(payload, 'p');
  return f;
}

inline const std::string kPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

}  // namespace ddprun::test
