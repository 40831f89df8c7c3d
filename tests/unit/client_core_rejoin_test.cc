// The rejoin loop both multi-node transports share (rendezvous/client/client_core.h): one backoff
// (jittered, from 100 ms doubling to 1 s), waited before each try, and one message with the
// window in seconds. The gRPC transport backed off from 100 ms and said seconds, etcd's from
// 50 ms and said milliseconds.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <functional>
#include <thread>
#include <vector>

#include "rendezvous/client/client_core.h"

using namespace std::chrono_literals;
using ddprun::ClientCore;

namespace {

ClientCore core(std::chrono::milliseconds heartbeatTimeout) {
  return ClientCore([](std::function<void()>) {}, heartbeatTimeout);
}

}  // namespace

TEST_CASE("client core: the rejoin loop waits a growing jittered step before each try", "[rendezvous]") {
  auto c = core(5s);
  std::vector<std::chrono::milliseconds> waits;
  int tries = 0;
  auto outcome = c.rejoin(c.openRejoinWindow(), [&] { return ++tries == 6; },
                          [&](std::chrono::milliseconds d) {
                            waits.push_back(d);
                            return false;
                          });
  CHECK(outcome == ClientCore::Rejoin::kJoined);
  CHECK(tries == 6);
  REQUIRE(waits.size() == 6);
  const std::vector<std::chrono::milliseconds> caps{100ms, 200ms, 400ms, 800ms, 1000ms, 1000ms};
  for (std::size_t i = 0; i < waits.size(); ++i) {
    CHECK(waits[i] >= caps[i] / 2);
    CHECK(waits[i] <= caps[i]);
  }
  // A new window starts the backoff over.
  waits.clear();
  c.rejoin(c.openRejoinWindow(), [] { return true; }, [&](std::chrono::milliseconds d) {
    waits.push_back(d);
    return false;
  });
  REQUIRE(waits.size() == 1);
  CHECK(waits[0] <= 100ms);
}

TEST_CASE("client core: the rejoin loop ends when the node stops, the job ended or the window passed", "[rendezvous]") {
  auto c = core(5s);
  int tries = 0;
  auto attempt = [&] {
    ++tries;
    return false;
  };
  CHECK(c.rejoin(c.openRejoinWindow(), attempt, [](std::chrono::milliseconds) { return true; }) ==
        ClientCore::Rejoin::kStopped);
  CHECK(tries == 0);
  CHECK(c.rejoin(std::chrono::steady_clock::now() - 1ms, attempt, [](std::chrono::milliseconds) { return false; }) ==
        ClientCore::Rejoin::kWindowPassed);
  CHECK(tries == 0);
  // No wait is longer than what is left of the window.
  auto d = core(5s);
  std::chrono::milliseconds longest{0};
  CHECK(d.rejoin(std::chrono::steady_clock::now() + 30ms, attempt, [&](std::chrono::milliseconds w) {
    longest = std::max(longest, w);
    std::this_thread::sleep_for(w);
    return false;
  }) == ClientCore::Rejoin::kWindowPassed);
  CHECK(longest <= 30ms);
  auto closed = core(5s);
  closed.fail("gone");
  CHECK(closed.rejoin(closed.openRejoinWindow(), attempt, [](std::chrono::milliseconds) { return false; }) ==
        ClientCore::Rejoin::kStopped);
}

TEST_CASE("client core: a window that passed is said in seconds on both transports", "[rendezvous]") {
  CHECK(core(2s).rejoinFailed("lost the rendezvous") == "lost the rendezvous; could not join again within 4s");
  CHECK(core(750ms).rejoinFailed("etcd unreachable") == "etcd unreachable; could not join again within 1.5s");
}
