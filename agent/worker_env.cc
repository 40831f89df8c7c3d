#include "agent/worker_env.h"

#include "common/strings.h"

namespace ddprun {

const std::vector<std::string>& contractVariableNames() {
  static const std::vector<std::string> names = {
      "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
      "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
      "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
      "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE", "OMP_NUM_THREADS",
      "TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING", "CUDA_VISIBLE_DEVICES",
      "DDPRUN_STORE_ADDR", "DDPRUN_STORE_PREFIX", "DDPRUN_ROUND", "DDPRUN_RECOVERY"};
  return names;
}

Environment buildWorkerEnv(const WorkerEnvInputs& in) {
  Environment env = in.inherited;
  const RoundInfo& r = in.round;
  const int rank = r.rankOffset + in.localRank;
  env.set("RANK", std::to_string(rank));
  env.set("LOCAL_RANK", std::to_string(in.virtualLocalRank ? 0 : in.localRank));
  env.set("WORLD_SIZE", std::to_string(r.worldSize));
  env.set("LOCAL_WORLD_SIZE", std::to_string(in.localWorldSize));
  env.set("GROUP_RANK", std::to_string(r.groupRank));
  env.set("GROUP_WORLD_SIZE", std::to_string(r.groupWorldSize));
  // One role per job: role ranks are the global ranks.
  env.set("ROLE_RANK", std::to_string(rank));
  env.set("ROLE_WORLD_SIZE", std::to_string(r.worldSize));
  env.set("ROLE_NAME", in.role);
  env.set("MASTER_ADDR", r.masterAddr);
  env.set("MASTER_PORT", std::to_string(r.masterPort));
  env.set("TORCHELASTIC_RESTART_COUNT", std::to_string(r.restartCount));
  env.set("TORCHELASTIC_MAX_RESTARTS", std::to_string(in.maxRestarts));
  env.set("TORCHELASTIC_RUN_ID", in.runId);
  // True: every rank is a TCPStore client of the agent's store at MASTER_ADDR:MASTER_PORT, which
  // outlives any rank. False: rank 0 hosts its own TCPStore there (--torch_store=rank0).
  env.set("TORCHELASTIC_USE_AGENT_STORE", in.agentStore ? "True" : "False");
  if (!in.errorFile.empty()) env.set("TORCHELASTIC_ERROR_FILE", in.errorFile);
  if (in.localWorldSize > 1) env.setDefault("OMP_NUM_THREADS", "1");
  env.setDefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");
  env.setDefault("NCCL_ASYNC_ERROR_HANDLING", "1");
  if (in.virtualLocalRank) {
    // Each worker sees only its own device, as device 0.
    std::string device = std::to_string(in.localRank);
    if (auto visible = in.inherited.get("CUDA_VISIBLE_DEVICES")) {
      auto devices = split(*visible, ',');
      if (in.localRank < static_cast<int>(devices.size())) device = std::string(trim(devices[in.localRank]));
    }
    env.set("CUDA_VISIBLE_DEVICES", device);
  }
  if (!r.storeAddr.empty()) {
    env.set("DDPRUN_STORE_ADDR", r.storeAddr);
    env.set("DDPRUN_STORE_PREFIX", r.storePrefix);
  }
  env.set("DDPRUN_ROUND", std::to_string(r.round));
  if (in.recoverInProcess) env.set("DDPRUN_RECOVERY", "in_process");
  return env;
}

}  // namespace ddprun
