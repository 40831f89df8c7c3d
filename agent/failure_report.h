// The summary printed when a job fails: the first failing rank, how it failed, the message it left
// in TORCHELASTIC_ERROR_FILE (torchrun's JSON format) and the last lines of its stderr.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "agent/error_file.h"
#include "agent/worker_group.h"

namespace ddprun {

// "SIGKILL" for 9; "signal 99" for unknown numbers.
std::string signalName(int sig);

struct FailureReportInput {
  std::string program;
  std::string host;
  WorkerExit first;
  std::string errorFile;
  std::optional<ErrorFileContent> error;
  std::vector<std::string> stderrTail;
  std::vector<WorkerExit> others;  // later failures that were not caused by stopping the group
};

std::string formatFailureReport(const FailureReportInput& in);

// ddprun's exit status for a failed worker: its exit code, or 128+N for signal N.
int exitStatusOf(const WorkerExit& exit);

}  // namespace ddprun
