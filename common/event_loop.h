// One epoll set and a wake-up that any thread may ring: the loop under the front door
// (netguard/connection_listener.cc), the relay (netguard/connection_relay.cc) and the store's
// framing (store/wire/store_wire_server.cc), each on its own thread. It owns only the OS part:
// registering descriptors under a key, waiting until an event, a wake-up or a deadline. What a
// loop does with its events, and its timers, stay with it.
//
// Level-triggered: a descriptor that is ready and not read is reported again at the next wait,
// so an owner that defers reading one must stop watching it for reading (modify).
#pragma once

#include <sys/epoll.h>

#include <chrono>
#include <cstdint>
#include <span>
#include <vector>

#include "common/unique_fd.h"

namespace ddprun {

class EventLoop {
 public:
  using Clock = std::chrono::steady_clock;

  // Throws SystemError when the kernel refuses an epoll set or an eventfd (descriptors exhausted).
  // `batch`: events returned by one wait() at most (the rest come at the next).
  explicit EventLoop(std::size_t batch = 256);
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  // Watches `fd` for `events` (EPOLLIN, EPOLLOUT, EPOLLRDHUP...; 0: registered, reports only
  // errors and hang-ups) under `key` (any but ~0, the wake-up's), which wait() reports with them. Failures (a closed fd) are
  // ignored: the owner learns of them from its own reads and writes.
  void add(int fd, uint64_t key, uint32_t events);
  void modify(int fd, uint64_t key, uint32_t events);
  // Not needed before closing `fd` unless the descriptor lives on elsewhere (handed over).
  void remove(int fd);

  // From any thread: the wait() under way, or the next one, returns at once with rung() true.
  void wake();

  // Waits until a watched descriptor is ready, wake() is rung, or `until` passes (at most `cap`
  // from now, so that owners that poll something each second need no timer for it). Returns the
  // ready descriptors' events (data.u64 is the key); valid until the next wait().
  std::span<const epoll_event> wait(Clock::time_point until, std::chrono::milliseconds cap = std::chrono::seconds(1));
  // Whether the last wait() returned (also) because wake() was rung.
  bool rung() const { return rung_; }

 private:
  UniqueFd epoll_;
  UniqueFd wake_;
  std::vector<epoll_event> events_;
  bool rung_ = false;
};

}  // namespace ddprun
