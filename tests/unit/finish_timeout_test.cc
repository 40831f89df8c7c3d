// FinishTimeout: --finish_timeout's verdict on the ranks still running after one finished.
#include "agent/finish_timeout.h"

#include <catch2/catch.hpp>

using ddprun::FinishTimeout;
using namespace std::chrono_literals;

namespace {
const auto t0 = std::chrono::steady_clock::time_point{} + 1000s;
}

TEST_CASE("finish timeout: ranks that never beat or beat too long ago are hung, and the report says who finished",
          "[agent][hang]") {
  FinishTimeout finish(5s);
  CHECK(finish.rankFinished(1));
  CHECK_FALSE(finish.rankFinished(3));  // the rendezvous is told once
  finish.peerFinished(7, "node-b");
  finish.peerFinished(8, "node-c");  // the first told is named
  CHECK(finish.start(t0));
  CHECK_FALSE(finish.start(t0 + 1s));  // once per attempt
  const auto verdict = finish.check({{0, 0, std::nullopt}, {2, 2, 6s}}, t0 + 5s);
  CHECK(verdict.hung == std::vector<int>{0, 2});
  CHECK_THAT(verdict.diagnosis, Catch::StartsWith("job hung at its end: finished: rank 1, rank 3, rank 7 (node node-b); "
                                                  "still running: rank 0, rank 2, 5.0s after the first rank finished "
                                                  "(--finish_timeout=5.0s)."));
  CHECK(verdict.hangNote == "still running 5.0s after rank 1, rank 3, rank 7 (node node-b) finished (--finish_timeout)");
}

TEST_CASE("finish timeout: a rank that beat within the bound is alive until its silence could reach it",
          "[agent][hang]") {
  FinishTimeout finish(5s);
  REQUIRE(finish.start(t0));
  const auto verdict = finish.check({{0, 10, 1s}, {1, 11, 3s}}, t0 + 5s);
  CHECK(verdict.hung.empty());
  CHECK(verdict.nextCheck == 2s);
  CHECK(verdict.diagnosis.empty());
}

TEST_CASE("finish timeout: off at 0", "[agent][hang]") {
  FinishTimeout off(0ms);
  CHECK_FALSE(off.start(t0));
}
