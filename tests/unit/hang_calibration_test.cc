// agent/hang_calibration.h: --hang_timeout=auto's rule, with made-up intervals.
#include "agent/hang_calibration.h"

#include <catch2/catch.hpp>

using ddprun::HangCalibration;
using ddprun::HangCalibrationRules;
using namespace std::chrono_literals;
using Intervals = std::initializer_list<std::chrono::milliseconds>;

namespace {

HangCalibrationRules rules() {
  HangCalibrationRules r;
  r.initial = 600s;
  r.factor = 5;
  r.floor = 2s;
  r.warmupIntervals = 2;
  r.maxSections = 3;
  return r;
}

}  // namespace

TEST_CASE("calibration: the initial bound until learned, then the longest interval times the factor", "[agent][hang]") {
  HangCalibration c(rules());
  CHECK(c.timeoutFor(0, "") == 600s);
  c.observe(0, "", 30s);  // warm-up: a slow first step teaches nothing
  c.observe(0, "", 20s);
  CHECK(c.timeoutFor(0, "") == 600s);
  c.observe(0, "", 1s);
  CHECK(c.timeoutFor(0, "") == 5s);
  c.observe(0, "", 1500ms);
  CHECK(c.timeoutFor(0, "") == 7500ms);
  c.observe(0, "", 100ms);  // the longest is kept
  CHECK(c.timeoutFor(0, "") == 7500ms);
  // Another rank still warming up in this attempt gets the longer of the two.
  CHECK(c.timeoutFor(1, "") == 600s);
}

TEST_CASE("calibration: per section, with a floor, kept across attempts with a new warm-up", "[agent][hang]") {
  HangCalibration c(rules());
  for (auto d : Intervals{1s, 1s, 100ms, 200ms}) c.observe(0, "", d);
  for (auto d : Intervals{9s, 9s, 40s}) c.observe(0, "checkpoint", d);
  CHECK(c.timeoutFor(0, "") == 2s);  // 5 x 0.2 s is below the floor
  CHECK(c.timeoutFor(0, "checkpoint") == 200s);
  auto lines = c.takeChanges();
  REQUIRE(lines.size() == 2);
  CHECK(lines[0] == "--hang_timeout=auto: section '(none)': longest interval 0.20s x 5, floor 2.00s: a rank silent "
                    "2.00s there is hung");
  CHECK(c.takeChanges().empty());  // logged once, again only when it grows by a quarter
  c.observe(0, "checkpoint", 45s);
  CHECK(c.takeChanges().empty());
  c.observe(0, "checkpoint", 60s);
  CHECK(c.takeChanges().size() == 1);

  c.newAttempt();
  CHECK(c.timeoutFor(0, "") == 600s);  // warming up again
  c.observe(0, "", 1s);
  c.observe(0, "", 1s);
  CHECK(c.timeoutFor(0, "") == 2s);  // what the first attempt learned (0.2 s: the floor)
}

TEST_CASE("calibration: sections beyond the bound share the unnamed one's value", "[agent][hang]") {
  HangCalibration c(rules());
  for (const char* s : {"", "a", "b"}) {
    for (auto d : Intervals{1s, 1s, 1s}) c.observe(0, s, d);
  }
  for (auto d : Intervals{1s, 1s, 30s}) c.observe(0, "c", d);  // a fourth section: counted as the unnamed one
  CHECK(c.timeoutFor(0, "c") == 150s);
  CHECK(c.timeoutFor(0, "") == 150s);
  CHECK(c.timeoutFor(0, "a") == 5s);
}
