// What this node exits with once the job is closed (README "Exit status"), and what it says: every
// node exits with the status of the job's first failure (the one the rendezvous saw first), so
// that a scheduler sees one exit code for the job; a node whose own workers failed also prints
// their report; a node excluded from the job (--exclude_node_after) exits kExitExcluded.
#pragma once

#include <optional>
#include <string>

#include "agent/failure_report.h"
#include "rendezvous/rules/node_view.h"

namespace ddprun {

struct ExitDecision {
  int status = 0;
  bool printReport = false;  // this node's failure report (the last attempt's) goes to stderr
  std::string error;         // a line to log at error level; empty: none
};

// `lastFailure`: the report of this node's last attempt that failed, if one did.
ExitDecision decideExit(const JobClosure& closure, const std::optional<FailureReportInput>& lastFailure);

}  // namespace ddprun
