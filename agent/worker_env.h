// The environment of one worker: torchrun's contract (DESIGN.md section 4) on top of what the agent
// inherited. Pure: the same inputs give the same environment, which --dry_run prints.
#pragma once

#include <string>

#include "common/environment.h"
#include "rendezvous/client/rendezvous.h"

namespace ddprun {

struct WorkerEnvInputs {
  Environment inherited;
  RoundInfo round;
  int localRank = 0;
  int localWorldSize = 1;
  std::string role = "default";
  int maxRestarts = 0;
  std::string runId = "none";
  std::string errorFile;
  bool virtualLocalRank = false;  // LOCAL_RANK=0 and CUDA_VISIBLE_DEVICES narrowed to one device
  // The agent serves torch's store (agent/torch_store.h) at the round's MASTER_ADDR:MASTER_PORT;
  // false: rank 0 hosts its own TCPStore there.
  bool agentStore = false;
  // --recovery=in_process: DDPRUN_RECOVERY=in_process tells python/ddprun/recovery.py that a
  // failed rank is replaced in place (so a rank's own exception waits for the next round).
  bool recoverInProcess = false;
};

Environment buildWorkerEnv(const WorkerEnvInputs& in);

// The names buildWorkerEnv sets (for --dry_run and tests).
const std::vector<std::string>& contractVariableNames();

}  // namespace ddprun
