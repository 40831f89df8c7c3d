#include "common/event_loop.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "common/error.h"

namespace ddprun {

namespace {
// Keys are the owners'; the wake-up's own is one no owner uses (listed in the header's contract:
// any key but this one).
constexpr uint64_t kWakeKey = ~uint64_t{0};
}  // namespace

EventLoop::EventLoop(std::size_t batch) : events_(std::max<std::size_t>(batch, 1)) {
  epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_) throw DDPRUN_SYSTEM_ERROR("epoll_create1");
  wake_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_) throw DDPRUN_SYSTEM_ERROR("eventfd");
  add(wake_.get(), kWakeKey, EPOLLIN);
}

void EventLoop::add(int fd, uint64_t key, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = key;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev);
}

void EventLoop::modify(int fd, uint64_t key, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = key;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, fd, &ev);
}

void EventLoop::remove(int fd) { ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr); }

void EventLoop::wake() {
  const uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof(one));
}

std::span<const epoll_event> EventLoop::wait(Clock::time_point until, std::chrono::milliseconds cap) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now()).count();
  const int timeout = static_cast<int>(std::clamp<int64_t>(left, 0, cap.count()));
  int n = ::epoll_wait(epoll_.get(), events_.data(), static_cast<int>(events_.size()), timeout);
  if (n < 0) n = 0;  // EINTR: a spurious wake-up, which every owner tolerates
  rung_ = false;
  // The wake-up is consumed here, before the owner looks at what it was woken for: a wake()
  // made meanwhile is then seen at the next wait, not lost.
  int kept = 0;
  for (int i = 0; i < n; ++i) {
    if (events_[i].data.u64 == kWakeKey) {
      uint64_t count = 0;
      (void)!::read(wake_.get(), &count, sizeof(count));
      rung_ = true;
      continue;
    }
    events_[kept++] = events_[i];
  }
  return {events_.data(), static_cast<std::size_t>(kept)};
}

}  // namespace ddprun
