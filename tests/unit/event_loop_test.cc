// common/event_loop.h: the one epoll loop under the front door, the relay and the store framing.
#include "common/event_loop.h"

#include <catch2/catch.hpp>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

using namespace std::chrono_literals;
using ddprun::EventLoop;
using ddprun::UniqueFd;

TEST_CASE("event loop: reports a ready descriptor under its key, and not once it is no longer watched", "[event_loop]") {
  EventLoop loop;
  int pair[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, pair) == 0);
  UniqueFd a(pair[0]), b(pair[1]);
  loop.add(a.get(), 42, EPOLLIN);
  REQUIRE(::write(b.get(), "x", 1) == 1);
  auto ready = loop.wait(EventLoop::Clock::now() + 5s);
  REQUIRE(ready.size() == 1);
  CHECK(ready[0].data.u64 == 42);
  CHECK((ready[0].events & EPOLLIN) != 0);
  CHECK_FALSE(loop.rung());
  // Level-triggered: unread, it is reported again; unwatched, it is not.
  CHECK(loop.wait(EventLoop::Clock::now() + 5s).size() == 1);
  loop.modify(a.get(), 42, 0);
  const auto before = EventLoop::Clock::now();
  CHECK(loop.wait(before + 50ms).empty());
  CHECK(EventLoop::Clock::now() - before >= 40ms);  // it slept until the deadline
}

TEST_CASE("event loop: a wake-up from another thread ends a wait, and is consumed", "[event_loop]") {
  EventLoop loop;
  std::thread ringer([&] {
    std::this_thread::sleep_for(20ms);
    loop.wake();
  });
  const auto ready = loop.wait(EventLoop::Clock::time_point::max(), 10s);
  ringer.join();
  CHECK(ready.empty());
  CHECK(loop.rung());
  // Consumed: the next wait sleeps to its deadline.
  CHECK(loop.wait(EventLoop::Clock::now() + 10ms).empty());
  CHECK_FALSE(loop.rung());
  // A wake-up made before the wait is not lost.
  loop.wake();
  loop.wait(EventLoop::Clock::now() + 10s);
  CHECK(loop.rung());
}

TEST_CASE("event loop: a wait is capped, so owners that look at something each second need no timer", "[event_loop]") {
  EventLoop loop;
  const auto before = EventLoop::Clock::now();
  CHECK(loop.wait(EventLoop::Clock::time_point::max(), 30ms).empty());
  CHECK(EventLoop::Clock::now() - before < 5s);
}
