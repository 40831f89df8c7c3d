#include "agent/progress_judge.h"

#include <algorithm>

namespace ddprun {

void ProgressJudge::judge(std::optional<int64_t> bestStep, bool endsInRestart, int restartCount) {
  const bool progressed = bestStep && (!highWater_ || *bestStep > *highWater_);
  if (bestStep) {
    everBeat_ = true;
    highWater_ = std::max(highWater_.value_or(*bestStep), *bestStep);
  }
  if (progressed) {
    restartsWithoutProgress_ = 0;
  } else if (endsInRestart && restartCount > 0) {
    ++restartsWithoutProgress_;
  }
}

std::string ProgressJudge::why() const {
  return std::to_string(restartsWithoutProgress_) + " restarts in a row made no progress (no rank beat a step beyond " +
         std::to_string(highWater_.value_or(0)) + ", the best of the attempts before): the job is stopped instead " +
         "of restarted again (--stop_without_progress=" + std::to_string(limit_) + ")";
}

}  // namespace ddprun
