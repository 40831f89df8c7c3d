// What the rules know of a failed worker: part of the rulebook's vocabulary (a job ended by a
// failure carries it to every node), so it lives here and not in the agent's interface.
#pragma once

#include <string>

namespace ddprun {

// A node's first worker failure in a round, as the job knows it.
struct WorkerFailure {
  int rank = -1;            // global rank
  int exitCode = -1;        // -1 when a signal ended it
  int signal = 0;
  int exitStatus = 1;       // what ddprun exits with for it: the code, 128 + signal, 124 if hung
  std::string description;  // "failed with exit code 7", "was killed by SIGSEGV", ...
  // > 0: the node's agent stops the job (--stop_without_progress): that many restarts in a row
  // made no progress, so no restart is spent on another.
  int attemptsWithoutProgress = 0;
};

}  // namespace ddprun
