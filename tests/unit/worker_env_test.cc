#include "agent/worker_env.h"

#include <algorithm>
#include <catch2/catch.hpp>

using ddprun::buildWorkerEnv;
using ddprun::Environment;
using ddprun::RoundInfo;
using ddprun::WorkerEnvInputs;

namespace {

// What the agent gives local rank `localRank` of a standalone job with nproc_per_node=2.
WorkerEnvInputs standaloneInputs(int localRank) {
  WorkerEnvInputs in;
  in.inherited.set("PATH", "/usr/bin:/bin");
  in.inherited.set("HOME", "/home/user");
  in.round.round = 0;
  in.round.groupRank = 0;
  in.round.groupWorldSize = 1;
  in.round.rankOffset = 0;
  in.round.worldSize = 2;
  in.round.restartCount = 0;
  in.round.masterAddr = "localhost";
  in.round.masterPort = 41234;
  in.localRank = localRank;
  in.localWorldSize = 2;
  in.role = "default";
  in.maxRestarts = 0;
  in.runId = "5c6a1f8e-0c1b-4a3d-9a7e-2f3b4c5d6e7f";
  in.errorFile = "/tmp/run/attempt_0/" + std::to_string(localRank) + "/error.json";
  return in;
}

std::string get(const Environment& env, const std::string& name) {
  auto value = env.get(name);
  INFO("variable " << name);
  REQUIRE(value.has_value());
  return *value;
}

}  // namespace

TEST_CASE("worker env carries torchrun's contract for a standalone 2-worker job", "[env]") {
  for (int localRank : {0, 1}) {
    INFO("local rank " << localRank);
    WorkerEnvInputs in = standaloneInputs(localRank);
    Environment env = buildWorkerEnv(in);
    CHECK(get(env, "RANK") == std::to_string(localRank));
    CHECK(get(env, "LOCAL_RANK") == std::to_string(localRank));
    CHECK(get(env, "WORLD_SIZE") == "2");
    CHECK(get(env, "LOCAL_WORLD_SIZE") == "2");
    CHECK(get(env, "GROUP_RANK") == "0");
    CHECK(get(env, "GROUP_WORLD_SIZE") == "1");
    CHECK(get(env, "ROLE_RANK") == std::to_string(localRank));
    CHECK(get(env, "ROLE_WORLD_SIZE") == "2");
    CHECK(get(env, "ROLE_NAME") == "default");
    CHECK(get(env, "MASTER_ADDR") == "localhost");
    CHECK(get(env, "MASTER_PORT") == "41234");
    CHECK(get(env, "TORCHELASTIC_RESTART_COUNT") == "0");
    CHECK(get(env, "TORCHELASTIC_MAX_RESTARTS") == "0");
    CHECK(get(env, "TORCHELASTIC_RUN_ID") == in.runId);
    CHECK(get(env, "TORCHELASTIC_ERROR_FILE") == in.errorFile);
    CHECK(get(env, "OMP_NUM_THREADS") == "1");
    CHECK(get(env, "NCCL_ASYNC_ERROR_HANDLING") == "1");
  }
}

TEST_CASE("worker env differs from torchrun where ddprun means to", "[env]") {
  Environment env = buildWorkerEnv(standaloneInputs(1));
  // ddprun hosts no agent store: PyTorch's rank 0 hosts its own.
  CHECK(get(env, "TORCHELASTIC_USE_AGENT_STORE") == "False");
  CHECK(get(env, "TORCH_NCCL_ASYNC_ERROR_HANDLING") == "1");
  CHECK(get(env, "DDPRUN_ROUND") == "0");
  // The local backend has no store for workers.
  CHECK_FALSE(env.contains("DDPRUN_STORE_ADDR"));
  CHECK_FALSE(env.contains("DDPRUN_STORE_PREFIX"));
  // Not asked for: the device list is left alone.
  CHECK_FALSE(env.contains("CUDA_VISIBLE_DEVICES"));
}

TEST_CASE("worker env names ddprun's store only when the round has one", "[env]") {
  WorkerEnvInputs in = standaloneInputs(0);
  in.round.storeAddr = "10.0.0.1:29400";
  in.round.storePrefix = "/job7/round3/";
  in.round.round = 3;
  Environment env = buildWorkerEnv(in);
  CHECK(get(env, "DDPRUN_STORE_ADDR") == "10.0.0.1:29400");
  CHECK(get(env, "DDPRUN_STORE_PREFIX") == "/job7/round3/");
  CHECK(get(env, "DDPRUN_ROUND") == "3");
}

TEST_CASE("worker env shows restarts and the restart budget", "[env]") {
  WorkerEnvInputs in = standaloneInputs(0);
  in.round.round = 4;
  in.round.restartCount = 2;
  in.maxRestarts = 3;
  Environment env = buildWorkerEnv(in);
  CHECK(get(env, "TORCHELASTIC_RESTART_COUNT") == "2");
  CHECK(get(env, "TORCHELASTIC_MAX_RESTARTS") == "3");
  CHECK(get(env, "DDPRUN_ROUND") == "4");
}

TEST_CASE("worker env of a later node: rankOffset shifts RANK and ROLE_RANK, not LOCAL_RANK", "[env]") {
  WorkerEnvInputs in = standaloneInputs(1);
  in.round.groupRank = 2;
  in.round.groupWorldSize = 3;
  in.round.rankOffset = 8;
  in.round.worldSize = 12;
  in.localWorldSize = 4;
  in.round.masterAddr = "10.1.2.3";
  in.round.masterPort = 29500;
  in.role = "trainer";
  Environment env = buildWorkerEnv(in);
  CHECK(get(env, "RANK") == "9");
  CHECK(get(env, "LOCAL_RANK") == "1");
  CHECK(get(env, "WORLD_SIZE") == "12");
  CHECK(get(env, "LOCAL_WORLD_SIZE") == "4");
  CHECK(get(env, "GROUP_RANK") == "2");
  CHECK(get(env, "GROUP_WORLD_SIZE") == "3");
  CHECK(get(env, "ROLE_RANK") == "9");
  CHECK(get(env, "ROLE_WORLD_SIZE") == "12");
  CHECK(get(env, "ROLE_NAME") == "trainer");
  CHECK(get(env, "MASTER_ADDR") == "10.1.2.3");
  CHECK(get(env, "MASTER_PORT") == "29500");
}

TEST_CASE("worker env passes inherited variables through", "[env]") {
  WorkerEnvInputs in = standaloneInputs(0);
  in.inherited.set("MY_SETTING", "value with spaces=and equals");
  in.inherited.set("EMPTY", "");
  Environment env = buildWorkerEnv(in);
  CHECK(get(env, "PATH") == "/usr/bin:/bin");
  CHECK(get(env, "HOME") == "/home/user");
  CHECK(get(env, "MY_SETTING") == "value with spaces=and equals");
  CHECK(get(env, "EMPTY").empty());
}

TEST_CASE("worker env overrides stale contract variables the agent inherited", "[env]") {
  WorkerEnvInputs in = standaloneInputs(1);
  in.inherited.set("RANK", "77");
  in.inherited.set("WORLD_SIZE", "99");
  in.inherited.set("MASTER_PORT", "1");
  in.inherited.set("TORCHELASTIC_USE_AGENT_STORE", "True");
  Environment env = buildWorkerEnv(in);
  CHECK(get(env, "RANK") == "1");
  CHECK(get(env, "WORLD_SIZE") == "2");
  CHECK(get(env, "MASTER_PORT") == "41234");
  CHECK(get(env, "TORCHELASTIC_USE_AGENT_STORE") == "False");
}

TEST_CASE("worker env keeps the user's OMP_NUM_THREADS and NCCL settings", "[env]") {
  WorkerEnvInputs in = standaloneInputs(0);
  in.inherited.set("OMP_NUM_THREADS", "8");
  in.inherited.set("NCCL_ASYNC_ERROR_HANDLING", "0");
  in.inherited.set("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3");
  Environment env = buildWorkerEnv(in);
  CHECK(get(env, "OMP_NUM_THREADS") == "8");
  CHECK(get(env, "NCCL_ASYNC_ERROR_HANDLING") == "0");
  CHECK(get(env, "TORCH_NCCL_ASYNC_ERROR_HANDLING") == "3");
}

TEST_CASE("worker env sets OMP_NUM_THREADS only with more than one worker", "[env]") {
  WorkerEnvInputs in = standaloneInputs(0);
  in.localWorldSize = 1;
  in.round.worldSize = 1;
  Environment env = buildWorkerEnv(in);
  CHECK_FALSE(env.contains("OMP_NUM_THREADS"));
  CHECK(get(env, "NCCL_ASYNC_ERROR_HANDLING") == "1");
}

TEST_CASE("virtual local rank: LOCAL_RANK 0 and one inherited device per worker", "[env]") {
  for (int localRank : {0, 1, 2}) {
    INFO("local rank " << localRank);
    WorkerEnvInputs in = standaloneInputs(localRank);
    in.localWorldSize = 3;
    in.round.worldSize = 3;
    in.virtualLocalRank = true;
    in.inherited.set("CUDA_VISIBLE_DEVICES", "4,6, 7");
    Environment env = buildWorkerEnv(in);
    CHECK(get(env, "LOCAL_RANK") == "0");
    CHECK(get(env, "RANK") == std::to_string(localRank));
    const char* expected[] = {"4", "6", "7"};
    CHECK(get(env, "CUDA_VISIBLE_DEVICES") == expected[localRank]);
  }
}

TEST_CASE("virtual local rank without CUDA_VISIBLE_DEVICES uses the local rank as the device", "[env]") {
  WorkerEnvInputs in = standaloneInputs(1);
  in.virtualLocalRank = true;
  Environment env = buildWorkerEnv(in);
  CHECK(get(env, "LOCAL_RANK") == "0");
  CHECK(get(env, "CUDA_VISIBLE_DEVICES") == "1");
}

TEST_CASE("without virtual local rank CUDA_VISIBLE_DEVICES passes through unchanged", "[env]") {
  WorkerEnvInputs in = standaloneInputs(1);
  in.inherited.set("CUDA_VISIBLE_DEVICES", "2,3");
  Environment env = buildWorkerEnv(in);
  CHECK(get(env, "LOCAL_RANK") == "1");
  CHECK(get(env, "CUDA_VISIBLE_DEVICES") == "2,3");
}

TEST_CASE("every variable buildWorkerEnv adds is listed in contractVariableNames", "[env]") {
  WorkerEnvInputs in = standaloneInputs(1);
  in.inherited = Environment{};
  in.virtualLocalRank = true;
  in.round.storeAddr = "h:1";
  in.round.storePrefix = "p";
  in.recoverInProcess = true;
  Environment env = buildWorkerEnv(in);
  const auto& names = ddprun::contractVariableNames();
  for (const auto& [name, value] : env.vars()) {
    INFO("variable " << name);
    CHECK(std::find(names.begin(), names.end(), name) != names.end());
  }
  // And with everything switched on, every listed name is set.
  CHECK(env.vars().size() == names.size());
}

TEST_CASE("buildWorkerEnv is pure: the same inputs give the same environment", "[env]") {
  WorkerEnvInputs in = standaloneInputs(1);
  CHECK(buildWorkerEnv(in).toStrings() == buildWorkerEnv(in).toStrings());
  CHECK(in.inherited.vars().size() == 2);  // the inputs are not changed
}
