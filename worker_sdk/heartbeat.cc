#include "worker_sdk/heartbeat.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>

#include "common/heartbeat_message.h"

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

// A duplicate of the inherited channel's end, or -1 when `fd` is no unix packet socket here (a
// process that did not inherit it, whose same number may be any other file).
int inheritedChannel(int fd) {
  if (fd < 0) return -1;
  int type = 0, domain = 0;
  socklen_t len = sizeof(type);
  if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_SEQPACKET) return -1;
  len = sizeof(domain);
  if (::getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0 || domain != AF_UNIX) return -1;
  return ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
}

}  // namespace

Heartbeat::Heartbeat(const Env& env)
    : Heartbeat(HeartbeatOptions{.socket = env.heartbeatSocket, .rank = env.rank, .fd = env.heartbeatFd}) {}

Heartbeat::Heartbeat(HeartbeatOptions options) : options_(std::move(options)) {
  fd_ = inheritedChannel(options_.fd);
  if (fd_ >= 0 || options_.socket.empty()) return;
  address_ = socketAddress(options_.socket);
  if (address_.empty()) return;
  fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
}

Heartbeat::~Heartbeat() {
  if (fd_ < 0) return;
  // The last held beat goes now: the steps of a short attempt count (--stop_without_progress).
  if (pending_) send(std::chrono::steady_clock::now());
  ::close(fd_);
}

void Heartbeat::beat(int64_t step, std::optional<double> stepSeconds) noexcept {
  if (fd_ < 0) return;
  step_ = step;
  if (stepSeconds) {
    if (auto clean = ddprun::cleanHeartbeatStepSeconds(*stepSeconds)) {
      timeSum_ += *clean;
      ++timeCount_;
    }
  }
  const auto now = std::chrono::steady_clock::now();
  const std::string_view current = sections_.empty() ? std::string_view() : std::string_view(sections_.back());
  if (sent_ && current == lastSection_ && now - lastSent_ < options_.minInterval) {
    pending_ = true;
    return;
  }
  send(now);
}

Heartbeat::Section Heartbeat::section(std::string_view name) {
  return Section(*this, ddprun::cleanHeartbeatSection(name));
}

Heartbeat::Section::Section(Heartbeat& heartbeat, std::string name) : heartbeat_(heartbeat), name_(std::move(name)) {
  heartbeat_.enter(name_);
}

Heartbeat::Section::~Section() { heartbeat_.leave(name_); }

void Heartbeat::enter(std::string name) noexcept {
  try {
    sections_.push_back(std::move(name));
  } catch (...) {
    return;  // out of memory: no section, training goes on
  }
  if (fd_ >= 0) send(std::chrono::steady_clock::now());  // a section change always goes
}

void Heartbeat::leave(const std::string& name) noexcept {
  if (!sections_.empty() && sections_.back() == name) sections_.pop_back();
  if (fd_ >= 0) send(std::chrono::steady_clock::now());
}

void Heartbeat::setRecoverable(bool on) noexcept {
  if (recoverable_ == on) return;
  recoverable_ = on;
  if (fd_ >= 0) send(std::chrono::steady_clock::now());  // the agent must know before a peer fails
}

void Heartbeat::reportFailed() noexcept {
  if (fd_ >= 0) send(std::chrono::steady_clock::now(), /*failed=*/true);
}

void Heartbeat::send(std::chrono::steady_clock::time_point now, bool failed) noexcept {
  sent_ = true;
  pending_ = false;
  lastSent_ = now;
  const std::string_view section = sections_.empty() ? std::string_view() : std::string_view(sections_.back());
  try {
    lastSection_.assign(section);
  } catch (...) {
  }
  std::optional<double> seconds;
  if (timeCount_ > 0) seconds = timeSum_ / timeCount_;
  timeSum_ = 0;
  timeCount_ = 0;
  char text[ddprun::kMaxHeartbeatDatagram + 1];
  std::size_t n = ddprun::formatHeartbeat(options_.rank, step_, section, seconds, text, sizeof(text));
  if (n == 0) return;
  // The recovery tokens go last, as the Python package writes them (its `extra`); a message that
  // would not fit the bound goes without them rather than not at all.
  std::size_t length = n;
  if (text[length - 1] == '\n') --length;
  const auto append = [&](std::string_view token) {
    if (length + token.size() + 1 > ddprun::kMaxHeartbeatDatagram) return;
    std::memcpy(text + length, token.data(), token.size());
    length += token.size();
  };
  if (recoverable_) append(" recoverable=1");
  if (failed) append(" failed=1");
  text[length++] = '\n';
  n = length;
  // Errors (no listener yet, a full queue, the agent gone) are dropped on purpose: the next beat
  // tries again.
  if (address_.empty()) {
    (void)::send(fd_, text, n, MSG_DONTWAIT | MSG_NOSIGNAL);
  } else {
    (void)::sendto(fd_, text, n, MSG_DONTWAIT | MSG_NOSIGNAL, reinterpret_cast<const sockaddr*>(address_.data()),
                   static_cast<socklen_t>(address_.size()));
  }
}

}  // namespace ddp
