// agent/straggler_detector.h: which rank is slow, from made-up step times.
#include "agent/straggler_detector.h"

#include <catch2/catch.hpp>

using ddprun::StragglerDetector;
using ddprun::StragglerRules;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

StragglerRules rules() {
  StragglerRules r;
  r.window = 10;
  r.minSamples = 3;
  r.evaluateEvery = 0ms;
  return r;
}

}  // namespace

TEST_CASE("stragglers: the rank well above the median is reported once, and when it recovers", "[agent][straggler]") {
  StragglerDetector d(rules());
  auto t = Clock::now();
  std::vector<ddprun::StragglerChange> changes;
  for (int step = 0; step < 5; ++step) {
    for (int rank = 0; rank < 4; ++rank) {
      auto c = d.observe(rank, rank == 2 ? 0.30 : 0.10 + 0.001 * rank, t += 1ms);
      changes.insert(changes.end(), c.begin(), c.end());
    }
  }
  REQUIRE(changes.size() == 1);
  CHECK(changes[0].rank == 2);
  CHECK(changes[0].straggling);
  CHECK(changes[0].seconds == Approx(0.30));
  CHECK(changes[0].ranks >= 3);  // judged as soon as three ranks had enough samples
  CHECK(d.stragglers() == std::set<int>{2});

  // One slow step of another rank (a GC pause) is no straggler: medians, not means.
  CHECK(d.observe(0, 5.0, t += 1ms).empty());

  changes.clear();
  for (int step = 0; step < 10; ++step) {
    auto c = d.observe(2, 0.10, t += 1ms);
    changes.insert(changes.end(), c.begin(), c.end());
  }
  REQUIRE(changes.size() == 1);
  CHECK_FALSE(changes[0].straggling);
  CHECK(d.stragglers().empty());
}

TEST_CASE("stragglers: tiny differences, too few samples, and one rank are never reported", "[agent][straggler]") {
  StragglerDetector d(rules());
  auto t = Clock::now();
  for (int step = 0; step < 10; ++step) {
    CHECK(d.observe(0, 0.0001, t += 1ms).empty());  // 3x, but by microseconds
    CHECK(d.observe(1, 0.0003, t += 1ms).empty());
  }
  StragglerDetector alone(rules());
  for (int step = 0; step < 10; ++step) CHECK(alone.observe(0, step, t += 1ms).empty());
  StragglerDetector few(rules());
  CHECK(few.observe(0, 0.1, t).empty());
  CHECK(few.observe(1, 1.0, t).empty());
  few.newAttempt();
  CHECK(few.stragglers().empty());
}
