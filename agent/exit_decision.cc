#include "agent/exit_decision.h"

#include "common/exit_codes.h"

namespace ddprun {

ExitDecision decideExit(const JobClosure& closure, const std::optional<FailureReportInput>& lastFailure) {
  ExitDecision decision;
  if (closure.outcome == JobOutcome::kSucceeded) return decision;
  decision.printReport = lastFailure.has_value();
  if (closure.exitStatus == kExitExcluded) {
    // Not the job's end: this node is out of it, the others go on.
    decision.status = kExitExcluded;
    decision.error = closure.reason + "; the job goes on without this node. Exit " + std::to_string(kExitExcluded) +
                     ": do not restart it on this host (README \"Exit status\")";
    return decision;
  }
  const auto& jobFailure = closure.failure;
  const bool firstIsElsewhere = jobFailure && (!lastFailure || jobFailure->rank != lastFailure->first.rank);
  if (firstIsElsewhere) {
    decision.error = "job failed: worker rank " + std::to_string(jobFailure->rank) +
                     (closure.failedNode.empty() ? "" : " on node " + closure.failedNode) + " " +
                     (jobFailure->description.empty() ? "failed" : jobFailure->description) + " (" + closure.reason +
                     ")";
  } else if (!lastFailure) {
    decision.error = "job failed: " + closure.reason;
  }
  decision.status = jobFailure    ? jobFailure->exitStatus
                    : lastFailure ? exitStatusOf(lastFailure->first)
                                  : closure.exitStatus;
  return decision;
}

}  // namespace ddprun
