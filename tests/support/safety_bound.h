// Time limits in C++ tests are safety bounds, not speed claims (speed is measured in bench/).
// A test that checks that something does NOT wait for X (a grace period, a heartbeat timeout, a
// call's deadline) makes X much longer than kSafetyBound, so that a loaded machine cannot fail it
// and a regression still does.
#pragma once

#include <chrono>

namespace ddprun::test {

inline constexpr std::chrono::seconds kSafetyBound{20};

}  // namespace ddprun::test
