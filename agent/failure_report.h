// The summary printed when a job fails: the first failing rank, how it failed, the message it left
// in TORCHELASTIC_ERROR_FILE (torchrun's JSON format) and the last lines of its stderr.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "agent/worker_group.h"

namespace ddprun {

struct ErrorFileContent {
  std::string message;
  std::string traceback;
  std::string timestamp;
};

// Reads torchrun's error file: {"message": {"message": ..., "extraInfo": {"py_callstack": ...,
// "timestamp": ...}}} or {"message": "..."}. nullopt when absent; a file that is not such JSON is
// reported as its raw text.
std::optional<ErrorFileContent> readErrorFile(const std::string& path);

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
