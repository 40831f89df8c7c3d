// The command line inside a Slurm step: flags not given come from the step (slurm_env.h), given
// ones win, contradictions and the wrong kind of Slurm context exit 2 with one line.
#include <catch2/catch.hpp>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "launcher/cli.h"
#include "test_util.h"

using ddprun::parseCommandLine;
using ddprun::test::OutputCapture;
using ddprun::test::ScopedEnv;
using Kind = ddprun::ParseResult::Kind;
using Catch::Contains;

namespace {

// Node `nodeId` of a two-node srun step on hosts that resolve here, with no PET_* defaults.
struct SlurmStepEnv {
  explicit SlurmStepEnv(const char* nodeId = "1", const char* nodelist = "localhost,127.0.0.1")
      : nodeid{"SLURM_NODEID", nodeId}, nodelist_{"SLURM_STEP_NODELIST", nodelist} {}
  ScopedEnv job{"SLURM_JOB_ID", "4242"};
  ScopedEnv step{"SLURM_STEP_ID", "0"};
  ScopedEnv nodes{"SLURM_STEP_NUM_NODES", "2"};
  ScopedEnv tasks{"SLURM_STEP_NUM_TASKS", "2"};
  ScopedEnv perNode{"SLURM_STEP_TASKS_PER_NODE", "1(x2)"};
  ScopedEnv nodeid;
  ScopedEnv nodelist_;
  ScopedEnv gpus{"SLURM_GPUS_ON_NODE", "3"};
  ScopedEnv restarts{"SLURM_RESTART_COUNT", std::nullopt};
  ScopedEnv noSlurm{"PET_NO_SLURM", std::nullopt};
  ScopedEnv petNnodes{"PET_NNODES", std::nullopt};
  ScopedEnv petNodeRank{"PET_NODE_RANK", std::nullopt};
  ScopedEnv petNproc{"PET_NPROC_PER_NODE", std::nullopt};
  ScopedEnv petPort{"PET_MASTER_PORT", std::nullopt};
  ScopedEnv petAddr{"PET_MASTER_ADDR", std::nullopt};
  ScopedEnv petId{"PET_RDZV_ID", std::nullopt};
  ScopedEnv petRunId{"PET_RUN_ID", std::nullopt};
  ScopedEnv petBackend{"PET_RDZV_BACKEND", std::nullopt};
  ScopedEnv petEndpoint{"PET_RDZV_ENDPOINT", std::nullopt};
  ScopedEnv petStandalone{"PET_STANDALONE", std::nullopt};
};

struct Parsed {
  ddprun::ParseResult result;
  std::string err;
};

Parsed parse(std::initializer_list<const char*> args) {
  std::vector<const char*> argv{"ddprun"};
  argv.insert(argv.end(), args.begin(), args.end());
  Parsed parsed;
  OutputCapture err(2);
  parsed.result = parseCommandLine(static_cast<int>(argv.size()), argv.data());
  parsed.err = err.text();
  return parsed;
}

ddprun::LaunchConfig parseRun(std::initializer_list<const char*> args) {
  Parsed parsed = parse(args);
  INFO("stderr: " << parsed.err);
  REQUIRE(parsed.result.kind == Kind::kRun);
  return parsed.result.config;
}

// Exit status 2 and the one line on stderr.
std::string usageError(std::initializer_list<const char*> args) {
  Parsed parsed = parse(args);
  INFO("stderr: " << parsed.err);
  CHECK(parsed.result.kind == Kind::kExit);
  CHECK(parsed.result.exitStatus == 2);
  CHECK(parsed.err.find('\n') == parsed.err.size() - 1);
  return parsed.err;
}

}  // namespace

TEST_CASE("cli slurm: no flags, everything from the step", "[slurm][cli]") {
  SlurmStepEnv env;
  auto cfg = parseRun({"/bin/true"});
  CHECK(cfg.minNodes == 2);
  CHECK(cfg.maxNodes == 2);
  CHECK(cfg.nodeRank == 1);
  CHECK(cfg.nprocPerNode == 3);
  CHECK(cfg.masterAddr == "localhost");
  CHECK(cfg.masterPort == 14242);
  CHECK(cfg.runId == "slurm-4242.0.r0");
  CHECK(cfg.multiNode);
  CHECK(cfg.rdzvBackend == ddprun::RdzvBackend::kStatic);
  CHECK(cfg.endpointHost == "localhost");
  CHECK(cfg.endpointPort == 14242);
  CHECK(cfg.isHost == std::optional<bool>(false));
  CHECK(cfg.slurmHosts == std::vector<std::string>{"localhost", "127.0.0.1"});
  CHECK(cfg.slurmStep == "job 4242 step 0 (restart 0), this is node 1 of 2");
}

TEST_CASE("cli slurm: flags and PET_* variables given win", "[slurm][cli]") {
  SlurmStepEnv env;
  ScopedEnv port{"PET_MASTER_PORT", "29600"};
  auto cfg = parseRun({"--nproc_per_node=2", "--master_addr=127.0.0.1", "--run_id=mine", "--nnodes=2",
                       "--node_rank=1", "/bin/true"});
  CHECK(cfg.nprocPerNode == 2);
  CHECK(cfg.masterAddr == "127.0.0.1");
  CHECK(cfg.masterPort == 29600);
  CHECK(cfg.runId == "mine");
  CHECK(cfg.nodeRank == 1);
}

TEST_CASE("cli slurm: --no_slurm, PET_NO_SLURM and --standalone take nothing from the step", "[slurm][cli]") {
  SlurmStepEnv env;
  for (auto cfg : {parseRun({"--no_slurm", "/bin/true"}), parseRun({"--standalone", "/bin/true"})}) {
    CHECK(cfg.minNodes == 1);
    CHECK(cfg.nprocPerNode == 1);
    CHECK_FALSE(cfg.multiNode);
    CHECK(cfg.slurmHosts.empty());
  }
  ScopedEnv off{"PET_NO_SLURM", "1"};
  auto cfg = parseRun({"/bin/true"});
  CHECK(cfg.minNodes == 1);
  CHECK(cfg.masterPort == 29500);
  CHECK(cfg.runId == "none");
}

TEST_CASE("cli slurm: contradicting the step is exit 2", "[slurm][cli]") {
  SlurmStepEnv env;
  CHECK_THAT(usageError({"--nnodes=4", "/bin/true"}), Contains("--nnodes 4 contradicts the Slurm step"));
  CHECK_THAT(usageError({"--node_rank=0", "/bin/true"}), Contains("--node_rank 0 contradicts the Slurm step"));
  ScopedEnv petRank{"PET_NODE_RANK", "0"};
  CHECK_THAT(usageError({"/bin/true"}), Contains("--node_rank 0 contradicts"));
}

TEST_CASE("cli slurm: a batch script is exit 2 with the srun line", "[slurm][cli]") {
  SlurmStepEnv env;
  ScopedEnv noStep{"SLURM_STEP_ID", std::nullopt};
  ScopedEnv jobNodes{"SLURM_JOB_NUM_NODES", "2"};
  ScopedEnv noStepNodes{"SLURM_STEP_NUM_NODES", std::nullopt};
  CHECK_THAT(usageError({"--max_restarts=1", "train.py"}),
             Contains("run one ddprun per node with `srun --nodes=2 --ntasks=2 --ntasks-per-node=1 ddprun "
                      "--max_restarts=1 train.py`"));
}

TEST_CASE("cli slurm: one-node step, loopback and the step's port", "[slurm][cli]") {
  SlurmStepEnv env("0", "localhost");
  ScopedEnv nodes{"SLURM_STEP_NUM_NODES", "1"};
  ScopedEnv tasks{"SLURM_STEP_NUM_TASKS", "1"};
  ScopedEnv perNode{"SLURM_STEP_TASKS_PER_NODE", "1"};
  auto cfg = parseRun({"/bin/true"});
  CHECK_FALSE(cfg.multiNode);
  CHECK(cfg.masterAddr == "127.0.0.1");
  CHECK(cfg.masterPort == 14242);
  CHECK(cfg.runId == "slurm-4242.0.r0");
}
