// Catch2's main, plus skipped test cases (test_skip.h): they are listed at the end, and when every
// test case that ran was skipped and none failed the executable exits with kSkipExitCode, which
// ctest reports as skipped (one test case per ctest test, see catch_discover_tests).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <map>
#include <string>

#include "test_skip.h"

namespace {

// What the listener saw: test cases run, assertions in the running one, and the skipped ones.
struct SkipTally {
  int testCasesRun = 0;
  int assertionsInCurrent = 0;
  std::map<std::string, std::string> skipped;  // test case -> reason
};

SkipTally& tally() {
  static SkipTally t;
  return t;
}

class SkipListener : public Catch::TestEventListenerBase {
 public:
  using TestEventListenerBase::TestEventListenerBase;

  void testCaseStarting(const Catch::TestCaseInfo& info) override {
    TestEventListenerBase::testCaseStarting(info);
    ++tally().testCasesRun;
    tally().assertionsInCurrent = 0;
  }

  bool assertionEnded(const Catch::AssertionStats& stats) override {
    ++tally().assertionsInCurrent;
    return TestEventListenerBase::assertionEnded(stats);
  }
};

}  // namespace

CATCH_REGISTER_LISTENER(SkipListener)

void ddprun::test::recordSkip(const std::string& reason) {
  const std::string name = Catch::getResultCapture().getCurrentTestName();
  if (tally().assertionsInCurrent > 0) {
    FAIL_CHECK("DDPRUN_SKIP after " << tally().assertionsInCurrent
                                    << " assertion(s): a test case either runs or skips (reason given: " << reason
                                    << ")");
    return;
  }
  tally().skipped.emplace(name, reason);
  std::printf("SKIPPED: %s: %s\n", name.c_str(), reason.c_str());
  std::fflush(stdout);
}

int main(int argc, char* argv[]) {
  Catch::Session session;
  if (const int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  const int rc = session.run();
  const SkipTally& t = tally();
  if (t.testCasesRun == 0) {
    const Catch::ConfigData& config = session.configData();
    const bool listing = config.listTests || config.listTestNamesOnly || config.listTags || config.listReporters;
    if (!listing && !config.testsOrTags.empty()) {
      // ctest runs one test case by name: a name that matches nothing ran nothing, which must not
      // pass. (A ';' in a test case's name made ctest split it, and ten test cases never ran.)
      std::fprintf(stderr, "no test case matched the filter: nothing ran\n");
      return 1;
    }
    return rc;  // --list-tests and the like
  }
  if (!t.skipped.empty()) {
    std::printf("%zu of %d test case(s) skipped, not passed:\n", t.skipped.size(), t.testCasesRun);
    for (const auto& [name, reason] : t.skipped) std::printf("  SKIPPED: %s: %s\n", name.c_str(), reason.c_str());
  }
  if (rc != 0) return rc == ddprun::test::kSkipExitCode ? rc + 1 : rc;  // failures are never read as a skip
  if (static_cast<int>(t.skipped.size()) == t.testCasesRun) return ddprun::test::kSkipExitCode;
  return 0;
}
