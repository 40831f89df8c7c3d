// netguard/handshake_queue.h: the relay's TLS handshakes per address, on a fake clock.
#include "netguard/handshake_queue.h"

#include <catch2/catch.hpp>

using namespace std::chrono_literals;
using ddprun::HandshakeQueue;

namespace {
const HandshakeQueue::Clock::time_point t0{};

HandshakeQueue::Options two() {
  HandshakeQueue::Options o;
  o.perAddress = 2;
  o.timeout = 10s;
  o.stallGrace = 1s;
  return o;
}
}  // namespace

TEST_CASE("handshake queue: an address runs perAddress at once, the rest wait in order", "[handshake_queue]") {
  HandshakeQueue q(two());
  CHECK(q.arrive(1, "a", t0));
  CHECK(q.arrive(2, "a", t0));
  CHECK_FALSE(q.arrive(3, "a", t0));
  CHECK_FALSE(q.arrive(4, "a", t0));
  CHECK(q.arrive(5, "b", t0));  // another address has its own turn
  CHECK(q.end(3, t0).empty());  // a waiting one closed: its place is skipped
  CHECK(q.end(1, t0 + 1ms) == std::vector<uint64_t>{4});
  CHECK(q.running() == 3);
  CHECK(q.waiting() == 0);
  CHECK(q.end(99, t0).empty());  // unknown: ignored
}

TEST_CASE("handshake queue: a deadline runs from the handshake's turn", "[handshake_queue]") {
  HandshakeQueue q(two());
  q.arrive(1, "a", t0);
  q.arrive(2, "a", t0);
  q.arrive(3, "a", t0);
  q.progressed(1, t0 + 9s);
  q.progressed(2, t0 + 9s);
  CHECK(q.expired(t0 + 9s).empty());
  const auto due = q.expired(t0 + 10s);
  REQUIRE(due.size() == 2);
  CHECK(due[0].why == HandshakeQueue::Why::kTimedOut);
  q.end(due[0].id, t0 + 10s);
  q.end(due[1].id, t0 + 10s);
  // 3 got its turn at 10 s: its deadline is 20 s, not 10.
  CHECK(q.expired(t0 + 19s).empty());
  CHECK(q.nextCheck() == t0 + 20s);
  REQUIRE(q.expired(t0 + 20s).size() == 1);
}

TEST_CASE("handshake queue: silent handshakes give their slot up when others of their address wait",
          "[handshake_queue]") {
  HandshakeQueue q(two());
  q.arrive(1, "a", t0);
  q.arrive(2, "a", t0);
  // Alone, a silent handshake keeps its slot until its deadline.
  CHECK(q.expired(t0 + 5s).empty());
  CHECK(q.nextCheck() == t0 + 10s);
  q.progressed(2, t0 + 5s);
  CHECK_FALSE(q.arrive(3, "a", t0 + 5s));
  // Now one waits: the one silent for the grace goes, the one heard from lately stays.
  CHECK(q.nextCheck() == t0 + 1s);
  const auto due = q.expired(t0 + 5s);
  REQUIRE(due.size() == 1);
  CHECK(due[0].id == 1);
  CHECK(due[0].why == HandshakeQueue::Why::kStalled);
  CHECK(q.end(1, t0 + 5s) == std::vector<uint64_t>{3});
  // No one waits any more: 2 and 3 keep their slots while silent.
  CHECK(q.expired(t0 + 9s).empty());
  // Silence counts from arrival: one that waited its turn without a byte is silent at its start.
  CHECK_FALSE(q.arrive(4, "a", t0 + 9s));
  q.progressed(2, t0 + 10s);
  q.progressed(3, t0 + 10s);
  CHECK(q.end(2, t0 + 11s) == std::vector<uint64_t>{4});
  CHECK_FALSE(q.arrive(5, "a", t0 + 11s));
  const auto silent = q.expired(t0 + 11s);
  REQUIRE(silent.size() == 1);
  CHECK(silent[0].id == 4);
}

TEST_CASE("handshake queue: 1,500 stalled handshakes delay a later one from their address by seconds, not a timeout per batch",
          "[handshake_queue]") {
  // Issue #37 item 5: 256 at once, 1,500 that never send a byte, then one real client; the relay
  // checks when nextCheck() says.
  HandshakeQueue::Options o;
  o.perAddress = 256;
  HandshakeQueue q(o);
  uint64_t id = 1;
  for (; id <= 1500; ++id) q.arrive(id, "a", t0);
  const uint64_t real = id;
  bool started = q.arrive(real, "a", t0);
  auto now = t0;
  int checks = 0;
  while (!started && checks < 10000) {
    now = std::max(now, q.nextCheck());
    for (const auto& e : q.expired(now)) {
      for (uint64_t s : q.end(e.id, now)) started = started || s == real;
    }
    ++checks;
  }
  REQUIRE(started);
  CHECK(now - t0 <= o.timeout);  // was 50 s: a whole timeout per batch of 256
  // Those that waited a grace in silence go as soon as they start: one grace in all.
  CHECK(now - t0 <= 2s);
}
