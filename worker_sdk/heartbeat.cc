#include "worker_sdk/heartbeat.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <cstring>

#include "worker_sdk/step_timing.h"

namespace ddp {

namespace {

// sockaddr_un bytes for a path or an '@' abstract name; empty when the name does not fit.
std::string socketAddress(const std::string& name) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const bool abstract = name[0] == '@';
  const std::size_t length = name.size();  // abstract: '\0' + the rest, the same length
  if (length > sizeof(addr.sun_path) - (abstract ? 0 : 1)) return {};
  std::memcpy(addr.sun_path, name.data(), length);
  if (abstract) addr.sun_path[0] = '\0';
  const std::size_t size = offsetof(sockaddr_un, sun_path) + length + (abstract ? 0 : 1);
  return std::string(reinterpret_cast<const char*>(&addr), size);
}

}  // namespace

Heartbeat::Heartbeat(const Env& env) : Heartbeat(HeartbeatOptions{env.heartbeatSocket, env.rank}) {}

Heartbeat::Heartbeat(HeartbeatOptions options) : options_(std::move(options)) {
  if (options_.socket.empty()) return;
  address_ = socketAddress(options_.socket);
  if (address_.empty()) return;
  fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
}

Heartbeat::~Heartbeat() {
  if (fd_ < 0) return;
  // The last thinned beat goes now: the steps of a short attempt count (--stop_without_progress).
  if (pending_) send(pendingStep_, std::chrono::steady_clock::now());
  ::close(fd_);
}

void Heartbeat::beat(int64_t step) noexcept {
  if (fd_ < 0) return;
  const auto now = std::chrono::steady_clock::now();
  if (sent_ && now - lastSent_ < options_.minInterval) {
    pending_ = true;
    pendingStep_ = step;
    return;
  }
  send(step, now);
}

void Heartbeat::send(int64_t step, std::chrono::steady_clock::time_point now) noexcept {
  sent_ = true;
  pending_ = false;
  lastSent_ = now;
  char text[80];
  // The step's compute time, when a GradientReducer measured one since the last beat.
  const auto compute = detail::takeStepCompute();
  const int n = compute ? std::snprintf(text, sizeof(text), "%d %lld time=%.6f\n", options_.rank,
                                        static_cast<long long>(step), *compute)
                        : std::snprintf(text, sizeof(text), "%d %lld\n", options_.rank, static_cast<long long>(step));
  if (n <= 0) return;
  // Errors (no listener yet, a full queue) are dropped on purpose: the next beat tries again.
  (void)::sendto(fd_, text, static_cast<std::size_t>(n), MSG_DONTWAIT | MSG_NOSIGNAL,
                 reinterpret_cast<const sockaddr*>(address_.data()), static_cast<socklen_t>(address_.size()));
}

}  // namespace ddp
