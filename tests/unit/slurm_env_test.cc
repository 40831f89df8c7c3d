#include "launcher/scheduler/slurm_env.h"

#include <catch2/catch.hpp>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"

using ddprun::ConfigError;
using ddprun::readSlurmStep;
using ddprun::slurmFlagValues;
using ddprun::SlurmStep;
using Catch::Contains;

namespace {

using Vars = std::map<std::string, std::string>;

const std::vector<std::string> kArgv{"ddprun", "train.py", "--lr", "0.1"};

// The environment of node `nodeId` of an srun step with one task per node, as Slurm 22.05 sets it.
Vars stepEnv(const std::string& nodelist, int nodes, int nodeId = 0) {
  return Vars{{"SLURM_JOB_ID", "4242"},
              {"SLURM_STEP_ID", "0"},
              {"SLURM_STEP_NUM_NODES", std::to_string(nodes)},
              {"SLURM_JOB_NUM_NODES", std::to_string(nodes)},
              {"SLURM_STEP_NODELIST", nodelist},
              {"SLURM_JOB_NODELIST", nodelist},
              {"SLURM_NODEID", std::to_string(nodeId)},
              {"SLURM_STEP_NUM_TASKS", std::to_string(nodes)},
              {"SLURM_STEP_TASKS_PER_NODE", "1(x" + std::to_string(nodes) + ")"}};
}

std::optional<SlurmStep> read(const Vars& vars, const std::vector<std::string>& argv = kArgv) {
  return readSlurmStep(
      [&](const std::string& name) -> std::optional<std::string> {
        auto it = vars.find(name);
        return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
      },
      argv);
}

SlurmStep readStep(const Vars& vars) {
  auto step = read(vars);
  REQUIRE(step);
  return *step;
}

std::map<std::string, std::string, std::less<>> flagValues(const SlurmStep& step, const Vars& given = {}) {
  return slurmFlagValues(step, [&](std::string_view name) -> std::optional<std::string> {
    auto it = given.find(std::string(name));
    return it == given.end() ? std::nullopt : std::optional<std::string>(it->second);
  });
}

}  // namespace

TEST_CASE("slurm: no SLURM_JOB_ID, no Slurm", "[slurm][slurm_env]") {
  CHECK_FALSE(read(Vars{}));
  CHECK_FALSE(read(Vars{{"SLURM_STEP_ID", "0"}, {"SLURM_NODEID", "1"}, {"SLURM_STEP_NODELIST", "n[1-2]"}}));
}

TEST_CASE("slurm: an srun step gives node count, node rank, hosts, port and run id", "[slurm][slurm_env]") {
  SlurmStep step = readStep(stepEnv("gpu[008-010]", 3, 2));
  CHECK(step.jobId == 4242);
  CHECK(step.stepId == 0);
  CHECK(step.nodeCount() == 3);
  CHECK(step.nodeId == 2);
  CHECK(step.hosts == std::vector<std::string>{"gpu008", "gpu009", "gpu010"});
  CHECK(step.port() == 14242);  // 10000 + (4242 + 0) % 20000
  CHECK(step.runId() == "slurm-4242.0.r0");
  CHECK(step.nprocPerNode == 1);

  auto values = flagValues(step);
  CHECK(values == std::map<std::string, std::string, std::less<>>{{"nnodes", "3"},
                                                                  {"node_rank", "2"},
                                                                  {"nproc_per_node", "1"},
                                                                  {"master_port", "14242"},
                                                                  {"rdzv_id", "slurm-4242.0.r0"},
                                                                  {"master_addr", "gpu008"}});
}

TEST_CASE("slurm: the port stays in 10000-29999 and differs between steps and jobs", "[slurm][slurm_env]") {
  SlurmStep step;
  step.jobId = 4294967295u;  // the largest job id
  step.stepId = 0;
  CHECK(step.port() == 10000 + 4294967295u % 20000);
  step.jobId = 19999;
  CHECK(step.port() == 29999);
  step.stepId = 1;
  CHECK(step.port() == 10000);
  step.jobId = 7;
  CHECK(step.port() == 10008);
}

TEST_CASE("slurm: a requeued job gets a new run id", "[slurm][slurm_env]") {
  Vars vars = stepEnv("n1", 1);
  vars["SLURM_RESTART_COUNT"] = "2";
  vars["SLURM_STEP_ID"] = "3";
  SlurmStep step = readStep(vars);
  CHECK(step.runId() == "slurm-4242.3.r2");
  CHECK(step.port() == 14245);
}

TEST_CASE("slurm: the step's counts come first, then the job's", "[slurm][slurm_env]") {
  // A step on 2 of the job's 4 nodes: the step's list and count win.
  Vars vars = stepEnv("n[3-4]", 2, 1);
  vars["SLURM_JOB_NUM_NODES"] = "4";
  vars["SLURM_JOB_NODELIST"] = "n[1-4]";
  CHECK(readStep(vars).hosts == std::vector<std::string>{"n3", "n4"});

  // Without the step's variables, the job's (older Slurm, or SLURM_NNODES only).
  Vars old = stepEnv("n[1-2]", 2, 1);
  old.erase("SLURM_STEP_NUM_NODES");
  old.erase("SLURM_STEP_NODELIST");
  old.erase("SLURM_JOB_NUM_NODES");
  old["SLURM_NNODES"] = "2";
  CHECK(readStep(old).hosts == std::vector<std::string>{"n1", "n2"});
}

TEST_CASE("slurm: workers per node from the GPUs Slurm gave this node", "[slurm][slurm_env]") {
  Vars vars = stepEnv("n[1-2]", 2);
  CHECK(readStep(vars).nprocPerNode == 1);
  vars["CUDA_VISIBLE_DEVICES"] = "0,1,2";
  CHECK(readStep(vars).nprocPerNode == 3);
  vars["CUDA_VISIBLE_DEVICES"] = "NoDevFiles";
  CHECK(readStep(vars).nprocPerNode == 1);
  vars["CUDA_VISIBLE_DEVICES"] = "GPU-1a2b,MIG-3c4d";
  CHECK(readStep(vars).nprocPerNode == 2);
  vars["SLURM_GPUS_ON_NODE"] = "8";
  CHECK(readStep(vars).nprocPerNode == 8);
  vars["SLURM_GPUS_ON_NODE"] = "0";  // none: the next source
  CHECK(readStep(vars).nprocPerNode == 2);
  vars["SLURM_GPUS_ON_NODE"] = "eight";
  CHECK_THROWS_WITH(read(vars), Contains("SLURM_GPUS_ON_NODE=eight is not a number"));
}

TEST_CASE("slurm: explicit flags win, and are not replaced", "[slurm][slurm_env]") {
  SlurmStep step = readStep(stepEnv("n[1-2]", 2, 1));
  auto values = flagValues(step, Vars{{"nnodes", "2"},
                                      {"node_rank", "1"},
                                      {"nproc_per_node", "4"},
                                      {"master_port", "29500"},
                                      {"rdzv_id", "mine"},
                                      {"master_addr", "10.0.0.1"}});
  CHECK(values.empty());
  // An elastic range that holds the step's count is no contradiction.
  CHECK_NOTHROW(flagValues(step, Vars{{"nnodes", "1:4"}}));
}

TEST_CASE("slurm: a one-node step keeps MASTER_ADDR on loopback", "[slurm][slurm_env]") {
  auto values = flagValues(readStep(stepEnv("n7", 1)));
  CHECK(values.count("master_addr") == 0);
  CHECK(values.at("nnodes") == "1");
}

TEST_CASE("slurm: with --rdzv_backend=grpc the endpoint is the first host at the step's port", "[slurm][slurm_env]") {
  SlurmStep step = readStep(stepEnv("n[1-2]", 2));
  CHECK(flagValues(step, Vars{{"rdzv_backend", "grpc"}}).at("rdzv_endpoint") == "n1:14242");
  CHECK(flagValues(step, Vars{{"rdzv_backend", "c10d"}}).at("rdzv_endpoint") == "n1:14242");
  CHECK(flagValues(step, Vars{{"rdzv_backend", "grpc"}, {"rdzv_endpoint", "x:1"}}).count("rdzv_endpoint") == 0);
  CHECK(flagValues(step).count("rdzv_endpoint") == 0);
}

TEST_CASE("slurm: flags that contradict the step are errors", "[slurm][slurm_env]") {
  SlurmStep step = readStep(stepEnv("n[1-2]", 2, 1));
  CHECK_THROWS_WITH(flagValues(step, Vars{{"nnodes", "4"}}),
                    "--nnodes 4 contradicts the Slurm step, which has 2 node(s): drop --nnodes, or srun with --nodes=4");
  CHECK_THROWS_WITH(flagValues(step, Vars{{"nnodes", "3:4"}}), Contains("has 2 node(s)"));
  CHECK_THROWS_WITH(flagValues(step, Vars{{"node_rank", "0"}}),
                    "--node_rank 0 contradicts the Slurm step, which runs this ddprun as node 1 (SLURM_NODEID): "
                    "drop --node_rank");
  CHECK_THROWS_AS(flagValues(step, Vars{{"nnodes", "two"}}), ConfigError);  // --nnodes' own message
}

TEST_CASE("slurm: a batch script or salloc shell gets the srun line to run instead", "[slurm][slurm_env]") {
  Vars batch{{"SLURM_JOB_ID", "77"}, {"SLURM_JOB_NUM_NODES", "2"}, {"SLURM_JOB_NODELIST", "n[1-2]"},
             {"SLURM_NTASKS_PER_NODE", "8"}, {"SLURM_NODEID", "0"}};
  const std::string srun = "`srun --nodes=2 --ntasks=2 --ntasks-per-node=1 ddprun train.py --lr 0.1`";
  CHECK_THROWS_WITH(read(batch), "inside Slurm job 77 but outside srun (no SLURM_STEP_ID): ddprun would start on "
                                 "this node only; run one ddprun per node with " +
                                     srun + " (or pass --no_slurm to run on this node alone)");
  for (const char* special : {"batch", "extern", "interactive", "4294967294", "4294967291"}) {
    batch["SLURM_STEP_ID"] = special;
    CHECK_THROWS_WITH(read(batch), Contains(std::string("(SLURM_STEP_ID=") + special + ", not an srun step)") &&
                                       Contains(srun));
  }
  // Without a node count the line leaves --nodes to srun.
  Vars bare{{"SLURM_JOB_ID", "77"}};
  CHECK_THROWS_WITH(read(bare), Contains("`srun --ntasks-per-node=1 ddprun train.py --lr 0.1`"));
}

TEST_CASE("slurm: several tasks per node get the srun line for one", "[slurm][slurm_env]") {
  const std::string srun = "`srun --nodes=3 --ntasks=3 --ntasks-per-node=1 ddprun train.py --lr 0.1`";
  Vars vars = stepEnv("n[1-3]", 3);
  vars["SLURM_STEP_TASKS_PER_NODE"] = "2(x2),1";
  vars["SLURM_STEP_NUM_TASKS"] = "5";
  CHECK_THROWS_WITH(read(vars), "this Slurm step runs several ddprun tasks per node (SLURM_STEP_TASKS_PER_NODE="
                                "2(x2),1), but one ddprun starts all the workers of its node; run " + srun);

  Vars requested = stepEnv("n[1-3]", 3);  // older Slurm: only the requested count
  requested.erase("SLURM_STEP_TASKS_PER_NODE");
  requested["SLURM_NTASKS_PER_NODE"] = "4";
  CHECK_THROWS_WITH(read(requested), Contains("(SLURM_NTASKS_PER_NODE=4)") && Contains(srun));

  Vars counted = stepEnv("n[1-3]", 3);  // no per-node list at all: more tasks than nodes
  counted.erase("SLURM_STEP_TASKS_PER_NODE");
  counted.erase("SLURM_STEP_NUM_TASKS");
  counted["SLURM_NTASKS"] = "6";
  CHECK_THROWS_WITH(read(counted), Contains("(SLURM_NTASKS=6 on 3 node(s))") && Contains(srun));

  // The step's own list is believed over a stale request inherited from sbatch.
  Vars stale = stepEnv("n[1-3]", 3);
  stale["SLURM_NTASKS_PER_NODE"] = "8";
  CHECK_NOTHROW(readStep(stale));
}

TEST_CASE("slurm: an inconsistent or malformed environment is a clear error", "[slurm][slurm_env]") {
  Vars vars = stepEnv("n[1-3]", 2);
  CHECK_THROWS_WITH(read(vars), "Slurm's SLURM_STEP_NODELIST=n[1-3] names 3 host(s), but SLURM_STEP_NUM_NODES=2");
  vars = stepEnv("n[1-", 2);
  CHECK_THROWS_WITH(read(vars), "Slurm's SLURM_STEP_NODELIST: hostlist 'n[1-': '[' without ']'");
  vars = stepEnv("n[0-99999999]", 2);
  CHECK_THROWS_WITH(read(vars), Contains("more than 65536 hosts"));
  vars = stepEnv("n[1-2]", 2, 2);
  CHECK_THROWS_WITH(read(vars), "Slurm's SLURM_NODEID=2 is not a number from 0 to 1");
  vars = stepEnv("n[1-2]", 2);
  vars.erase("SLURM_NODEID");
  CHECK_THROWS_WITH(read(vars), Contains("without SLURM_NODEID"));
  vars = stepEnv("n[1-2]", 2);
  vars["SLURM_STEP_TASKS_PER_NODE"] = "1(2)";
  CHECK_THROWS_WITH(read(vars), Contains("is not a list like 2(x3),1"));
  vars = stepEnv("n[1-2]", 2);
  vars["SLURM_JOB_ID"] = "12ab";
  CHECK_THROWS_WITH(read(vars), Contains("SLURM_JOB_ID=12ab is not a number"));
}

TEST_CASE("slurm: the srun line quotes what the shell would split", "[slurm][slurm_env]") {
  CHECK(ddprun::shellCommandLine({"ddprun", "--nproc_per_node=2", "a b.py", "it's", ""}) ==
        "ddprun --nproc_per_node=2 'a b.py' 'it'\\''s' ''");
  CHECK(ddprun::shellCommandLine({"x", "two\nlines", "it's\t\\"}) == "x $'two\\x0alines' $'it\\x27s\\x09\\x5c'");
}
