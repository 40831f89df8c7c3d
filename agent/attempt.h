// Everything the agent knows about one attempt (one round's worker group) that the next attempt
// starts afresh: the agent resets it in one assignment (attempt_ = Attempt(...)), so that no
// field of an old attempt can leak into a new one by being forgotten.
#pragma once

#include <chrono>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agent/failure_report.h"
#include "agent/finish_timeout.h"
#include "agent/worker_group.h"
#include "rendezvous/client/rendezvous.h"

namespace ddprun {

struct Attempt {
  Attempt(RoundInfo r, std::chrono::milliseconds finishTimeout) : round(std::move(r)), finish(finishTimeout) {}

  RoundInfo round;
  bool groupStopped = false;
  bool judged = false;                     // --stop_without_progress judged it (agent/progress_judge.h)
  std::optional<WorkerExit> firstFailure;  // a failed or hung rank: the attempt ends
  FinishTimeout finish;                    // --finish_timeout
  // A hang's evidence (agent/stack_dump.h, agent/hang_attribution.h).
  std::string diagnosis;  // the failure report's explanation (finish timeout, flight recorder, stacks)
  std::chrono::steady_clock::time_point dumpDeadline;
  std::set<int> dumping;  // local ranks sent SIGABRT whose dump is awaited
  std::vector<FailureReportInput::RankStack> stacks;
  bool recorderAttributed = false;  // the hang was attributed by the flight recorders
};

}  // namespace ddprun
