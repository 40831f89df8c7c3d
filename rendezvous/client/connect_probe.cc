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

Unreachable probeConnection(const std::string& endpoint, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::string host;
  int port = 0;
  try {
    std::tie(host, port) = parseEndpoint(endpoint, 0);
  } catch (const Error&) {
    return {};  // not ours to judge: the channel reports it
  }
  const Connected c = connectWithin(host, port, deadline);
  switch (c.failure) {
    case Connected::Failure::kNone:
      break;
    case Connected::Failure::kResolve:
      return {"its host name does not resolve"};
    case Connected::Failure::kRefused:
      return {"nothing listens there (connection refused)"};
    case Connected::Failure::kTimeout:
      return {"no answer (a firewall, a partition, or a host that is down)"};
    case Connected::Failure::kOther:
      return {c.why};
  }
  const UniqueFd& fd = c.fd;
  const std::string preface = http2ClientPreface();
  (void)!::send(fd.get(), preface.data(), preface.size(), MSG_NOSIGNAL);
  std::string received;
  char buf[4096];
  bool closed = false;
  while (received.size() < 16384 && waitFor(fd.get(), POLLIN, deadline)) {
    ssize_t n = ::recv(fd.get(), buf, sizeof(buf), 0);
    if (n > 0) {
      received.append(buf, static_cast<std::size_t>(n));
      if (auto reason = goAwayReason(received)) return {"it refused the connection: " + *reason};
      continue;
    }
    if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
      closed = true;
      break;
    }
  }
  if (received.empty() && closed) {
    return {"it accepts connections but closes them at once (a server at its connection limit, or not a ddprun "
            "rendezvous)"};
  }
  if (received.empty()) {
    // A gRPC server sends its SETTINGS as the connection opens: nothing at all is a port that
    // accepts and stays silent (not a gRPC server), or a server that is stuck.
    return {"it accepts connections but answers nothing within " + std::to_string(timeout.count()) +
            " ms (not a gRPC server, or a stuck one): check that --rdzv_endpoint names the rendezvous's port "
            "and that its server is alive"};
  }
  // An HTTP/1.x server answering the preface it cannot parse ("HTTP/1.1 400 Bad Request"; some,
  // taking it for HTTP/0.9, send only an HTML page).
  const bool statusLine = received.rfind("HTTP/1.", 0) == 0;
  if (statusLine || received.rfind("<!DOCTYPE", 0) == 0 || received.rfind("<html", 0) == 0 ||
      received.rfind("<HTML", 0) == 0) {
    return {"it answered in " + (statusLine ? received.substr(0, 8) : std::string("HTTP/1")) +
                ", not gRPC (HTTP/2): a web server or a proxy; point --rdzv_endpoint at the rendezvous's port "
                "(ddprun-rdzv --port, or the hosting agent's)",
            true};
  }
  // The first frame an HTTP/2 server sends is its SETTINGS (type 4 in the frame header's 4th byte).
  if (received.size() >= 9 && received[3] == 0x4) return {};
  if (received.size() >= 3 && (received[0] == 0x15 || received[0] == 0x16) && received[1] == 0x03) {
    return {"it answered in TLS: give this node --rdzv_conf protocol=https,cacert=CA.pem if it is the rendezvous"};
  }
  return {"it answered, but not in HTTP/2 (not a gRPC server): check that --rdzv_endpoint names the rendezvous's "
          "port"};
}

std::string whyUnreachable(const std::string& endpoint, std::chrono::milliseconds timeout) {
  return probeConnection(endpoint, timeout).why;
}

}  // namespace ddprun
