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
  // A hang: what it means (the finish timeout's verdict), and the stack of every rank that still
  // ran here when it was declared (agent/stack_dump.h), the first rank's included.
  std::string diagnosis;
  struct RankStack {
    int rank = 0;
    int localRank = 0;
    std::vector<std::string> lines;  // the dump; empty: see `missing`
    std::string missing;             // why there is no stack
    bool inErrorFile = false;        // shown as the error file's traceback already
  };
  std::vector<RankStack> stacks;
};

std::string formatFailureReport(const FailureReportInput& in);

class WorkerGroup;

// The report of `first`, the group's first failure: its error file (written with the diagnosis
// and its stack when a hung rank could not write one), the tail of its stderr, the other ranks'
// failures not caused by stopping the group, and the stacks taken before the kill.
FailureReportInput gatherFailureReport(const WorkerGroup& group, const WorkerExit& first, const std::string& program,
                                       const std::string& host, const std::string& diagnosis,
                                       const std::vector<FailureReportInput::RankStack>& stacks);

// ddprun's exit status for a failed worker: its exit code, or 128+N for signal N.
int exitStatusOf(const WorkerExit& exit);

}  // namespace ddprun
