// ProgressJudge: --stop_without_progress's streak of restarts without a new best step.
#include "agent/progress_judge.h"

#include <catch2/catch.hpp>

using ddprun::ProgressJudge;

TEST_CASE("progress: K restarts in a row without a new best step stop the job", "[agent][progress]") {
  ProgressJudge judge(2);
  judge.judge(10, true, 0);  // the first attempt: progress from nothing
  CHECK_FALSE(judge.stopNow());
  judge.judge(10, true, 1);  // the same step again
  CHECK(judge.restartsWithoutProgress() == 1);
  CHECK_FALSE(judge.stopNow());
  judge.judge(8, true, 2);  // less
  CHECK(judge.stopNow());
  CHECK(judge.why() == "2 restarts in a row made no progress (no rank beat a step beyond 10, the best of the "
                       "attempts before): the job is stopped instead of restarted again (--stop_without_progress=2)");
}

TEST_CASE("progress: a new best step resets the streak, and ranks that never beat are not judged", "[agent][progress]") {
  ProgressJudge judge(1);
  judge.judge(10, true, 0);
  judge.judge(11, true, 1);
  CHECK(judge.restartsWithoutProgress() == 0);
  CHECK_FALSE(judge.stopNow());

  ProgressJudge silent(1);
  for (int attempt = 0; attempt < 5; ++attempt) silent.judge(std::nullopt, true, attempt);
  CHECK(silent.restartsWithoutProgress() == 4);
  CHECK_FALSE(silent.stopNow());  // nothing ever beat: not judged

  ProgressJudge off(0);
  off.judge(1, true, 0);
  off.judge(1, true, 1);
  CHECK_FALSE(off.stopNow());
}

TEST_CASE("progress: an attempt that does not end in a restart does not count", "[agent][progress]") {
  ProgressJudge judge(1);
  judge.judge(10, true, 0);
  judge.judge(10, false, 1);  // interrupted by a membership change, not a failure
  CHECK_FALSE(judge.stopNow());
}
