#include "launcher/scheduler/slurm_env.h"

#include <algorithm>

#include "common/error.h"
#include "common/strings.h"
#include "launcher/flag_parsing.h"
#include "launcher/scheduler/slurm_hostlist.h"

namespace ddprun {
namespace {

// Step ids above this are Slurm's special steps (batch, extern, interactive, pending), whatever
// the version numbers them; srun steps count up from 0.
constexpr uint64_t kMaxNormalStepId = 0xfffffff0;

// The first of `names` that is set, with its value.
std::optional<std::pair<std::string, std::string>> firstSet(const EnvLookup& env,
                                                            std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (auto value = env(name)) return std::pair{std::string(name), *value};
  }
  return std::nullopt;
}

std::string shown(const std::string& name, const std::string& value) {
  return name + "=" + printable(value, 64);
}

// A whole non-negative decimal number within [min, max], else ConfigError naming the variable.
uint64_t number(const std::string& name, const std::string& value, uint64_t min, uint64_t max) {
  auto n = parseInt(trim(value));
  if (!n || *n < 0 || static_cast<uint64_t>(*n) < min || static_cast<uint64_t>(*n) > max) {
    throw ConfigError("Slurm's " + shown(name, value) + " is not a number from " + std::to_string(min) + " to " +
                      std::to_string(max));
  }
  return static_cast<uint64_t>(*n);
}

// The largest count in a tasks-per-node list such as "2(x3),1".
uint64_t maxTasksPerNode(const std::string& name, const std::string& value) {
  uint64_t most = 0;
  for (const std::string& item : split(value, ',')) {
    std::string count = item.substr(0, item.find('('));
    if (count.size() != item.size()) {
      std::string repeat = item.substr(count.size());
      if (repeat.size() < 4 || !startsWith(repeat, "(x") || !endsWith(repeat, ")") ||
          !parseInt(repeat.substr(2, repeat.size() - 3))) {
        throw ConfigError("Slurm's " + shown(name, value) + " is not a list like 2(x3),1");
      }
    }
    most = std::max(most, number(name, count, 0, 1u << 20));
  }
  return most;
}

// CUDA_VISIBLE_DEVICES' devices: indices or GPU-/MIG- UUIDs, up to the first other entry (CUDA
// stops there; Slurm writes "NoDevFiles" when a step has none).
int visibleDevices(const std::string& value) {
  int count = 0;
  for (const std::string& entry : split(value, ',')) {
    std::string_view id = trim(entry);
    bool index = !id.empty() && id.find_first_not_of("0123456789") == std::string_view::npos;
    if (!index && !startsWith(id, "GPU-") && !startsWith(id, "MIG-")) break;
    ++count;
  }
  return count;
}

int nprocFromStep(const EnvLookup& env) {
  if (auto gpus = env("SLURM_GPUS_ON_NODE")) {
    uint64_t n = number("SLURM_GPUS_ON_NODE", *gpus, 0, 1u << 20);
    if (n > 0) return static_cast<int>(n);
  }
  if (auto visible = env("CUDA_VISIBLE_DEVICES")) {
    if (int n = visibleDevices(*visible); n > 0) return n;
  }
  return 1;
}

std::string srunLine(std::optional<uint64_t> nodes, const std::vector<std::string>& argv) {
  std::string line = "srun ";
  if (nodes) line += "--nodes=" + std::to_string(*nodes) + " --ntasks=" + std::to_string(*nodes) + " ";
  return line + "--ntasks-per-node=1 " + shellCommandLine(argv);
}

}  // namespace

int SlurmStep::port() const { return static_cast<int>(10000 + (jobId + stepId) % 20000); }

std::string SlurmStep::runId() const {
  return "slurm-" + std::to_string(jobId) + "." + std::to_string(stepId) + ".r" + std::to_string(restartCount);
}

std::string SlurmStep::describe() const {
  return "job " + std::to_string(jobId) + " step " + std::to_string(stepId) + " (restart " +
         std::to_string(restartCount) + "), this is node " + std::to_string(nodeId) + " of " +
         std::to_string(nodeCount());
}

std::optional<SlurmStep> readSlurmStep(const EnvLookup& env, const std::vector<std::string>& argv) {
  auto job = env("SLURM_JOB_ID");
  if (!job) return std::nullopt;
  SlurmStep step;
  step.jobId = number("SLURM_JOB_ID", *job, 0, UINT32_MAX);
  auto nodes = firstSet(env, {"SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES"});
  std::optional<uint64_t> nodeCount;
  if (nodes) nodeCount = number(nodes->first, nodes->second, 1, kMaxHostlistHosts);

  // A batch script or an salloc shell is one process on one node: guessing a multi-node job from
  // it would start a fraction of the job. Say what to run instead.
  auto stepVar = firstSet(env, {"SLURM_STEP_ID", "SLURM_STEPID"});
  auto stepId = stepVar ? parseInt(trim(stepVar->second)) : std::nullopt;
  if (!stepId || *stepId < 0 || static_cast<uint64_t>(*stepId) > kMaxNormalStepId) {
    std::string where = stepVar ? shown(stepVar->first, stepVar->second) + ", not an srun step" : "no SLURM_STEP_ID";
    throw ConfigError("inside Slurm job " + std::to_string(step.jobId) + " but outside srun (" + where +
                      "): ddprun would start on this node only; run one ddprun per node with `" +
                      srunLine(nodeCount, argv) + "` (or pass --no_slurm to run on this node alone)");
  }
  step.stepId = static_cast<uint64_t>(*stepId);
  if (!nodeCount) throw ConfigError("Slurm step without a node count (SLURM_STEP_NUM_NODES is not set)");

  // One ddprun per node: it starts the node's workers itself, so a second task would start them
  // twice (and both would claim the node's rank).
  auto perNode = firstSet(env, {"SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"});
  auto tasks = firstSet(env, {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"});
  std::optional<std::string> several;
  if (perNode && maxTasksPerNode(perNode->first, perNode->second) > 1) {
    several = shown(perNode->first, perNode->second);
  } else if (tasks && number(tasks->first, tasks->second, 1, UINT32_MAX) > *nodeCount) {
    several = shown(tasks->first, tasks->second) + " on " + std::to_string(*nodeCount) + " node(s)";
  }
  if (several) {
    throw ConfigError("this Slurm step runs several ddprun tasks per node (" + *several +
                      "), but one ddprun starts all the workers of its node; run `" + srunLine(nodeCount, argv) + "`");
  }

  auto list = firstSet(env, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"});
  if (!list) throw ConfigError("Slurm step without a node list (SLURM_STEP_NODELIST is not set)");
  try {
    step.hosts = expandSlurmHostlist(list->second);
  } catch (const ConfigError& e) {
    throw ConfigError("Slurm's " + list->first + ": " + e.what());
  }
  if (step.hosts.size() != *nodeCount) {
    throw ConfigError("Slurm's " + shown(list->first, list->second) + " names " + std::to_string(step.hosts.size()) +
                      " host(s), but " + shown(nodes->first, nodes->second));
  }
  auto nodeId = env("SLURM_NODEID");
  if (!nodeId) throw ConfigError("Slurm step without SLURM_NODEID (this node's rank in the step)");
  step.nodeId = static_cast<int>(number("SLURM_NODEID", *nodeId, 0, *nodeCount - 1));
  if (auto restarts = env("SLURM_RESTART_COUNT")) {
    step.restartCount = static_cast<int>(number("SLURM_RESTART_COUNT", *restarts, 0, 1000000));
  }
  step.nprocPerNode = nprocFromStep(env);
  return step;
}

std::map<std::string, std::string, std::less<>> slurmFlagValues(const SlurmStep& step, const GivenFlagLookup& given) {
  std::map<std::string, std::string, std::less<>> values;
  const int nodes = step.nodeCount();
  if (auto nnodes = given("nnodes")) {
    NodeRange range = parseNnodes(*nnodes);
    if (nodes < range.min || nodes > range.max) {
      throw ConfigError("--nnodes " + *nnodes + " contradicts the Slurm step, which has " + std::to_string(nodes) +
                        " node(s): drop --nnodes, or srun with --nodes=" + *nnodes);
    }
  } else {
    values["nnodes"] = std::to_string(nodes);
  }
  if (auto rank = given("node_rank")) {
    // A rank that is not a number is left to --node_rank's own check.
    auto n = parseInt(trim(*rank));
    if (n && *n != step.nodeId) {
      throw ConfigError("--node_rank " + *rank + " contradicts the Slurm step, which runs this ddprun as node " +
                        std::to_string(step.nodeId) + " (SLURM_NODEID): drop --node_rank");
    }
  } else {
    values["node_rank"] = std::to_string(step.nodeId);
  }
  if (!given("nproc_per_node")) values["nproc_per_node"] = std::to_string(step.nprocPerNode);
  if (!given("master_port")) values["master_port"] = std::to_string(step.port());
  if (!given("rdzv_id")) values["rdzv_id"] = step.runId();
  // One node: the host is this one, and loopback needs no name lookup.
  if (!given("master_addr") && nodes > 1) values["master_addr"] = step.hosts.front();
  auto backend = given("rdzv_backend");
  if (backend && (trim(*backend) == "grpc" || trim(*backend) == "c10d") && !given("rdzv_endpoint")) {
    values["rdzv_endpoint"] = step.hosts.front() + ":" + std::to_string(step.port());
  }
  return values;
}

std::string shellCommandLine(const std::vector<std::string>& words) {
  std::string line;
  for (const std::string& word : words) {
    if (!line.empty()) line += ' ';
    bool plain = !word.empty() && word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                         "0123456789_./:=,@%+-") == std::string::npos;
    if (plain) {
      line += word;
      continue;
    }
    bool printableOnly = std::all_of(word.begin(), word.end(), [](char c) { return c >= 0x20 && c < 0x7f; });
    if (printableOnly) {
      line += '\'';
      for (char c : word) line += c == '\'' ? std::string("'\\''") : std::string(1, c);
      line += '\'';
      continue;
    }
    // A newline or another control byte: bash's $'...' with \xNN, so that the line stays one line.
    line += "$'";
    for (unsigned char c : word) {
      if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') {
        line += static_cast<char>(c);
      } else {
        static const char* kHex = "0123456789abcdef";
        line += std::string("\\x") + kHex[c >> 4] + kHex[c & 15];
      }
    }
    line += '\'';
  }
  return line;
}

}  // namespace ddprun
