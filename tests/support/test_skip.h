// Skipping a test case that cannot run on this machine (no GPU, a build without NCCL), for
// Catch2 2.x, which has no SKIP. A skipped test is reported as skipped, with its reason, and is
// never counted as passed:
//
//   TEST_CASE("nccl: ...") {
//     if (ddp::detail::cudaDeviceCount() == 0) DDPRUN_SKIP("needs a CUDA device; none is visible");
//     ...
//   }
//
// DDPRUN_SKIP(reason) prints "SKIPPED: <test case>: <reason>" on stdout and returns from the
// TEST_CASE body (so use it there, not in a helper function, a lambda or a SECTION), before any
// assertion: a test case either runs or skips; a skip after an assertion fails the test case.
// catch_main.cc then exits with kSkipExitCode when every test case it ran was skipped and none
// failed; catch_discover_tests(... PROPERTIES SKIP_RETURN_CODE 77) in tests/unit/CMakeLists.txt
// and tests/integration/CMakeLists.txt makes ctest report that test as "Skipped", and
// scripts/test.sh lists the reasons at the end of the run.
#pragma once

#include <string>

namespace ddprun::test {

// The exit status of a test executable whose test cases were all skipped (automake's convention).
inline constexpr int kSkipExitCode = 77;

// Records that the running test case is skipped and why, and prints the SKIPPED line (defined in
// catch_main.cc). Fails the test case instead when it already made assertions.
void recordSkip(const std::string& reason);

}  // namespace ddprun::test

#define DDPRUN_SKIP(reason)                 \
  do {                                      \
    ::ddprun::test::recordSkip(reason);     \
    return;                                 \
  } while (false)
