#include "common/connect.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

namespace ddprun {

namespace {

using Clock = std::chrono::steady_clock;

// Waits for a non-blocking connect to finish; the socket's error (0: connected), or ETIMEDOUT.
int finishConnect(int fd, Clock::time_point until) {
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now()).count();
    if (left <= 0) return ETIMEDOUT;
    pollfd p{fd, POLLOUT, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30)));
    if (rc == 0) return ETIMEDOUT;
    if (rc < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    return err;
  }
}

Connected failed(Connected::Failure failure, std::string why) {
  Connected c;
  c.failure = failure;
  c.why = std::move(why);
  return c;
}

}  // namespace

Connected connectWithin(const std::string& host, int port, Clock::time_point deadline,
                        std::chrono::milliseconds perAttempt) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0 || !found) {
    return failed(Connected::Failure::kResolve,
                  "cannot resolve '" + host + "': " + (rc != 0 ? ::gai_strerror(rc) : "no address"));
  }
  const std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> addresses(found, &::freeaddrinfo);
  Connected last = failed(Connected::Failure::kOther, "no address");
  for (const addrinfo* ai = found; ai; ai = ai->ai_next) {
    UniqueFd fd(::socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd) {
      last = failed(Connected::Failure::kOther, std::strerror(errno));
      continue;
    }
    int err = ::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      const auto now = Clock::now();
      const auto attemptEnd = perAttempt == std::chrono::milliseconds::max() || deadline - now <= perAttempt
                                  ? deadline
                                  : now + perAttempt;
      err = finishConnect(fd.get(), attemptEnd);
    }
    if (err == 0) {
      Connected ok;
      ok.fd = std::move(fd);
      return ok;
    }
    last = failed(err == ECONNREFUSED ? Connected::Failure::kRefused
                  : err == ETIMEDOUT  ? Connected::Failure::kTimeout
                                      : Connected::Failure::kOther,
                  err == ETIMEDOUT ? "connect timed out" : std::strerror(err));
    if (Clock::now() >= deadline) break;
  }
  return last;
}

}  // namespace ddprun
