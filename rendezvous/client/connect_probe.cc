#include "rendezvous/client/connect_probe.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <tuple>

#include "common/connect.h"
#include "common/error.h"
#include "common/http2_refusal.h"
#include "common/net.h"
#include "common/unique_fd.h"

namespace ddprun {
namespace {

using Clock = std::chrono::steady_clock;

// Waits for `events` on fd until `deadline`; false on timeout.
bool waitFor(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, static_cast<int>(left));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) return false;
  }
}

}  // namespace

std::string whyUnreachable(const std::string& endpoint, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::string host;
  int port = 0;
  try {
    std::tie(host, port) = parseEndpoint(endpoint, 0);
  } catch (const Error&) {
    return "";  // not ours to judge: the channel reports it
  }
  const Connected c = connectWithin(host, port, deadline);
  switch (c.failure) {
    case Connected::Failure::kNone:
      break;
    case Connected::Failure::kResolve:
      return "its host name does not resolve";
    case Connected::Failure::kRefused:
      return "nothing listens there (connection refused)";
    case Connected::Failure::kTimeout:
      return "no answer (a firewall, a partition, or a host that is down)";
    case Connected::Failure::kOther:
      return c.why;
  }
  const UniqueFd& fd = c.fd;
  const std::string preface = http2ClientPreface();
  (void)!::send(fd.get(), preface.data(), preface.size(), MSG_NOSIGNAL);
  std::string received;
  char buf[4096];
  while (received.size() < 16384 && waitFor(fd.get(), POLLIN, deadline)) {
    ssize_t n = ::recv(fd.get(), buf, sizeof(buf), 0);
    if (n > 0) {
      received.append(buf, static_cast<std::size_t>(n));
      if (auto reason = goAwayReason(received)) return "it refused the connection: " + *reason;
      continue;
    }
    if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
      return received.empty() ? "it accepts connections but closes them at once (a server at its connection limit, "
                                "or not a ddprun rendezvous)"
                              : "";
    }
  }
  return "";  // it answered (a server's SETTINGS) and kept the connection: gRPC will get there
}

}  // namespace ddprun
