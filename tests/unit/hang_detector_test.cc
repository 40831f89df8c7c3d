// HangDetector: the hang evidence of heartbeats, on a clock the test moves (no I/O of its own).
#include "agent/hang_detector.h"

#include <catch2/catch.hpp>

using ddprun::HangDetector;
using ddprun::HeartbeatMessage;
using namespace std::chrono_literals;

namespace {
const auto t0 = std::chrono::steady_clock::time_point{} + 1000s;
}

TEST_CASE("hang detector: the first rank silent past the bound, once per attempt", "[hang]") {
  HangDetector d(1s);
  CHECK(d.checkPeriod() == 250ms);
  d.arm();
  CHECK(d.observe(HeartbeatMessage{0, 5, "", std::nullopt}, t0));
  CHECK(d.observe(HeartbeatMessage{1, 4, "checkpoint", std::nullopt}, t0));
  CHECK(d.observe(HeartbeatMessage{0, 6, "", std::nullopt}, t0 + 500ms));
  CHECK_FALSE(d.check(t0 + 999ms));
  auto hung = d.check(t0 + 1200ms);
  REQUIRE(hung);
  CHECK(hung->rank == 1);
  CHECK(hung->lastStep == 4);
  CHECK(hung->section == "checkpoint");
  CHECK(hung->silentFor == 1200ms);
  CHECK(hung->bound == 1s);
  CHECK_FALSE(hung->calibrated);
  CHECK_FALSE(d.check(t0 + 5s));  // one report per attempt
  CHECK(d.bestStep() == 6);
  d.arm();
  CHECK_FALSE(d.bestStep());
  CHECK_FALSE(d.check(t0 + 10s));  // nobody beat in this attempt
}

TEST_CASE("hang detector: a finished rank is not watched, but its steps count for the attempt", "[hang]") {
  HangDetector d(1s);
  d.arm();
  d.observe(HeartbeatMessage{0, 5, "", std::nullopt}, t0);
  d.forget(0);
  CHECK_FALSE(d.observe(HeartbeatMessage{0, 9, "", 0.5}, t0 + 10ms));  // no straggler sample either
  CHECK(d.bestStep() == 9);
  CHECK_FALSE(d.silentFor(0, t0 + 2s));
  CHECK_FALSE(d.check(t0 + 2s));
}

TEST_CASE("hang detector: disarmed, nothing is taken or reported, and a timeout of 0 only listens", "[hang]") {
  HangDetector d(1s);
  CHECK_FALSE(d.observe(HeartbeatMessage{0, 5, "", std::nullopt}, t0));  // not armed yet
  d.arm();
  d.observe(HeartbeatMessage{0, 5, "", std::nullopt}, t0);
  d.disarm();
  CHECK_FALSE(d.check(t0 + 5s));
  HangDetector listening(0ms);
  CHECK(listening.checkPeriod() == 0ms);
  listening.arm();
  listening.observe(HeartbeatMessage{2, 1, "", std::nullopt}, t0);
  CHECK(listening.silentFor(2, t0 + 3s) == 3000ms);
  CHECK_FALSE(listening.check(t0 + 1h));
}
