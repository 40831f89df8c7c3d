// Slurm as ddprun's entrypoint: `srun --ntasks-per-node=1 ddprun train.py` with no flags. Inside
// an srun step every flag the user did not give comes from the step's environment (node count,
// node rank, the rendezvous host and port, the run id, workers per node). Pure: the environment
// and the flags given arrive as lookups, so every rule is unit-tested without a real Slurm.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun {

// A variable's value, nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// What ddprun takes from one srun step (one ddprun task per node).
struct SlurmStep {
  uint64_t jobId = 0;
  uint64_t stepId = 0;
  int restartCount = 0;             // SLURM_RESTART_COUNT: a requeued job's incarnation
  int nodeId = 0;                   // SLURM_NODEID: this node's rank in the step
  std::vector<std::string> hosts;   // the step's nodes, in node-rank order
  int nprocPerNode = 1;             // SLURM_GPUS_ON_NODE, else CUDA_VISIBLE_DEVICES' count, else 1

  int nodeCount() const { return static_cast<int>(hosts.size()); }
  // 10000 + (job id + step id) % 20000: the same on every node of the step, unprivileged, below
  // Linux's ephemeral range (32768), and different for steps of one job that run side by side.
  int port() const;
  // slurm-<job>.<step>.r<restarts>: a requeued job never meets its previous incarnation.
  std::string runId() const;
  // "job 4242 step 0 (restart 0), this is node 1 of 2", for --dry_run.
  std::string describe() const;
};

// The step this process runs in, nullopt outside Slurm (no SLURM_JOB_ID). Throws ConfigError,
// with the srun line to run instead (built from `argv`), in a batch script or salloc shell (no
// srun step) and when the step runs several tasks per node; and on an inconsistent environment
// (a malformed node list, a node count the list does not match).
std::optional<SlurmStep> readSlurmStep(const EnvLookup& env, const std::vector<std::string>& argv);

// A flag's value when the user gave it (command line or PET_* variable), else nullopt.
using GivenFlagLookup = std::function<std::optional<std::string>(std::string_view name)>;

// The value, as typed text, of every flag the step supplies and the user did not give:
// nnodes, node_rank, nproc_per_node, master_port, rdzv_id, master_addr (the first host; a
// one-node step keeps loopback), and rdzv_endpoint (first host:port) for --rdzv_backend=grpc.
// A given --nnodes or --node_rank that contradicts the step throws ConfigError.
std::map<std::string, std::string, std::less<>> slurmFlagValues(const SlurmStep& step, const GivenFlagLookup& given);

// `words` as one shell command line on one line, each word quoted where the shell would split or
// expand it (bash's $'...' for a word with control bytes).
std::string shellCommandLine(const std::vector<std::string>& words);

}  // namespace ddprun
