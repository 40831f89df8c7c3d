// LogLimiter (common/log_limiter.h): one line per interval for a repeatable event, the next one
// saying how many were held back. A fake clock: no sleeping.
#include <catch2/catch.hpp>

#include "common/log_limiter.h"

using ddprun::LogLimiter;
using namespace std::chrono_literals;

TEST_CASE("log limiter: one line per interval, the next counts the ones held back", "[logging]") {
  LogLimiter limiter(10s);
  const auto t0 = LogLimiter::Clock::time_point{} + 1h;
  REQUIRE(limiter.allow(t0) == 0u);
  for (int i = 0; i < 4689; ++i) CHECK_FALSE(limiter.allow(t0 + std::chrono::microseconds(i)).has_value());
  CHECK_FALSE(limiter.allow(t0 + 9s).has_value());
  auto next = limiter.allow(t0 + 10s);
  REQUIRE(next.has_value());
  CHECK(*next == 4690u);
  CHECK(ddprun::heldBackNote(*next) == " (4690 more like it since the last such line)");
  CHECK(ddprun::heldBackNote(0).empty());
  CHECK(limiter.allow(t0 + 21s) == 0u);
}
