// ddp::Env: the worker's environment contract parsed and checked; every bad value is reported
// with the variable's name.
#include <catch2/catch.hpp>

#include <map>
#include <string>

#include "common/error.h"
#include "test_util.h"
#include "worker_sdk/env.h"

using Catch::Matchers::Contains;
using ddp::Env;
using Vars = std::map<std::string, std::string>;

namespace {

// What ddprun gives rank 5 of 8 (node 1 of 2, 4 workers per node) in round 3.
Vars goodVars() {
  return {{"RANK", "5"},
          {"LOCAL_RANK", "1"},
          {"WORLD_SIZE", "8"},
          {"LOCAL_WORLD_SIZE", "4"},
          {"GROUP_RANK", "1"},
          {"GROUP_WORLD_SIZE", "2"},
          {"MASTER_ADDR", "10.0.0.1"},
          {"MASTER_PORT", "29500"},
          {"TORCHELASTIC_RESTART_COUNT", "2"},
          {"TORCHELASTIC_RUN_ID", "job42"},
          {"DDPRUN_ROUND", "3"},
          {"DDPRUN_STORE_ADDR", "10.0.0.1:29400"},
          {"DDPRUN_STORE_PREFIX", "/run/job42/round/3/"}};
}

Vars with(Vars vars, const std::string& name, const std::string& value) {
  vars[name] = value;
  return vars;
}

Vars without(Vars vars, const std::string& name) {
  vars.erase(name);
  return vars;
}

// The ConfigError's message for vars; fails the test when parsing succeeds.
std::string errorFor(const Vars& vars) {
  try {
    Env::fromEnvironment(vars);
  } catch (const ddprun::ConfigError& e) {
    return e.what();
  }
  FAIL("no ConfigError");
  return {};
}

}  // namespace

TEST_CASE("Env reads the whole contract", "[sdk]") {
  const Env env = Env::fromEnvironment(goodVars());
  CHECK(env.rank == 5);
  CHECK(env.localRank == 1);
  CHECK(env.worldSize == 8);
  CHECK(env.localWorldSize == 4);
  CHECK(env.groupRank == 1);
  CHECK(env.groupWorldSize == 2);
  CHECK(env.masterAddr == "10.0.0.1");
  CHECK(env.masterPort == 29500);
  CHECK(env.restartCount == 2);
  CHECK(env.round == 3);
  CHECK(env.runId == "job42");
  CHECK(env.storeAddr == "10.0.0.1:29400");
  CHECK(env.storePrefix == "/run/job42/round/3/");
  CHECK(env.token.empty());
  CHECK(env.heartbeatSocket.empty());
  CHECK(env.heartbeatFd == -1);
}

TEST_CASE("Env defaults the optional variables", "[sdk]") {
  Vars vars = goodVars();
  for (const char* name : {"TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID", "DDPRUN_ROUND", "DDPRUN_STORE_ADDR",
                           "DDPRUN_STORE_PREFIX"}) {
    vars.erase(name);
  }
  const Env env = Env::fromEnvironment(vars);
  CHECK(env.restartCount == 0);
  CHECK(env.round == 0);
  CHECK(env.runId.empty());
  CHECK(env.storeAddr.empty());
}

TEST_CASE("Env takes run id and round from the store prefix when they are not given", "[sdk]") {
  Vars vars = without(without(goodVars(), "DDPRUN_ROUND"), "TORCHELASTIC_RUN_ID");
  vars["DDPRUN_STORE_PREFIX"] = "/run/a/b/round/7/";
  const Env env = Env::fromEnvironment(vars);
  CHECK(env.round == 7);
  CHECK(env.runId == "a/b");
}

TEST_CASE("Env prefers DDPRUN_RUN_ID to TORCHELASTIC_RUN_ID", "[sdk]") {
  Vars vars = without(goodVars(), "DDPRUN_STORE_PREFIX");
  vars["DDPRUN_RUN_ID"] = "mine";
  CHECK(Env::fromEnvironment(vars).runId == "mine");
}

TEST_CASE("Env names every missing required variable", "[sdk]") {
  for (const char* name : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                           "MASTER_ADDR", "MASTER_PORT"}) {
    INFO(name);
    CHECK_THAT(errorFor(without(goodVars(), name)), Contains(name) && Contains("not set"));
    CHECK_THAT(errorFor(with(goodVars(), name, "  ")), Contains(name));
  }
}

TEST_CASE("Env names every variable that is not a non-negative integer", "[sdk]") {
  for (const char* name : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                           "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "DDPRUN_ROUND"}) {
    for (const char* bad : {"abc", "-1", "3x", "1.5", "99999999999999999999"}) {
      INFO(name << "=" << bad);
      CHECK_THAT(errorFor(with(goodVars(), name, bad)), Contains(name));
    }
  }
}

TEST_CASE("Env rejects inconsistent ranks and sizes, naming the variable", "[sdk]") {
  CHECK_THAT(errorFor(with(goodVars(), "RANK", "8")), Contains("RANK=8") && Contains("WORLD_SIZE=8"));
  CHECK_THAT(errorFor(with(goodVars(), "LOCAL_RANK", "4")), Contains("LOCAL_RANK=4") && Contains("LOCAL_WORLD_SIZE=4"));
  CHECK_THAT(errorFor(with(goodVars(), "GROUP_RANK", "2")), Contains("GROUP_RANK=2"));
  CHECK_THAT(errorFor(with(goodVars(), "WORLD_SIZE", "0")), Contains("WORLD_SIZE=0"));
  CHECK_THAT(errorFor(with(goodVars(), "LOCAL_WORLD_SIZE", "0")), Contains("LOCAL_WORLD_SIZE=0"));
  CHECK_THAT(errorFor(with(goodVars(), "LOCAL_WORLD_SIZE", "16")), Contains("LOCAL_WORLD_SIZE=16"));
  CHECK_THAT(errorFor(with(goodVars(), "GROUP_WORLD_SIZE", "9")), Contains("GROUP_WORLD_SIZE=9"));
  CHECK_THAT(errorFor(with(goodVars(), "MASTER_PORT", "0")), Contains("MASTER_PORT"));
  CHECK_THAT(errorFor(with(goodVars(), "MASTER_PORT", "65536")), Contains("MASTER_PORT"));
}

TEST_CASE("Env checks DDPRUN_STORE_PREFIX against the round and the run id", "[sdk]") {
  CHECK_THAT(errorFor(with(goodVars(), "DDPRUN_STORE_PREFIX", "/run/job42/round/2/")),
             Contains("DDPRUN_STORE_PREFIX") && Contains("DDPRUN_ROUND=3"));
  CHECK_THAT(errorFor(with(goodVars(), "DDPRUN_STORE_PREFIX", "/run/other/round/3/")),
             Contains("DDPRUN_STORE_PREFIX") && Contains("job42"));
  for (const char* bad : {"job42/3", "/run/job42/round/3", "/run//round/3/", "/run/job42/round/x/", "/round/3/"}) {
    INFO(bad);
    CHECK_THAT(errorFor(with(goodVars(), "DDPRUN_STORE_PREFIX", bad)), Contains("DDPRUN_STORE_PREFIX"));
  }
}

TEST_CASE("Env reads the job token from DDPRUN_RDZV_TOKEN or the token file", "[sdk]") {
  ddprun::test::TempDir dir;
  CHECK(Env::fromEnvironment(with(goodVars(), "DDPRUN_RDZV_TOKEN", "s3cret")).token == "s3cret");

  ddprun::test::writeFile(dir.file("token"), "  from-file \nsecond line\n", 0600);
  Vars vars = with(with(goodVars(), "DDPRUN_RDZV_TOKEN", "s3cret"), "DDPRUN_RDZV_TOKEN_FILE", dir.file("token"));
  CHECK(Env::fromEnvironment(vars).token == "from-file");  // the file wins, as in the launcher

  CHECK_THAT(errorFor(with(goodVars(), "DDPRUN_RDZV_TOKEN_FILE", dir.file("missing"))),
             Contains("DDPRUN_RDZV_TOKEN_FILE"));
  ddprun::test::writeFile(dir.file("empty"), "\n", 0600);
  CHECK_THAT(errorFor(with(goodVars(), "DDPRUN_RDZV_TOKEN_FILE", dir.file("empty"))),
             Contains("DDPRUN_RDZV_TOKEN_FILE") && Contains("empty"));
}

TEST_CASE("Env::fromEnviron reads this process's environment", "[sdk]") {
  std::vector<std::unique_ptr<ddprun::test::ScopedEnv>> scoped;
  for (const auto& [name, value] : goodVars()) scoped.push_back(std::make_unique<ddprun::test::ScopedEnv>(name, value));
  scoped.push_back(std::make_unique<ddprun::test::ScopedEnv>("DDPRUN_HEARTBEAT_SOCKET", "@hb"));
  scoped.push_back(std::make_unique<ddprun::test::ScopedEnv>("DDPRUN_HEARTBEAT_FD", "7"));
  scoped.push_back(std::make_unique<ddprun::test::ScopedEnv>("DDPRUN_RDZV_TOKEN_FILE", std::nullopt));
  scoped.push_back(std::make_unique<ddprun::test::ScopedEnv>("DDPRUN_RUN_ID", std::nullopt));
  const Env env = Env::fromEnviron();
  CHECK(env.rank == 5);
  CHECK(env.round == 3);
  CHECK(env.heartbeatSocket == "@hb");
  CHECK(env.heartbeatFd == 7);  // the inherited channel (docs/heartbeat.md)

  ddprun::test::ScopedEnv noRank("RANK", std::nullopt);
  CHECK_THROWS_WITH(Env::fromEnviron(), Contains("RANK is not set"));
}

TEST_CASE("Env: a DDPRUN_HEARTBEAT_FD that is no descriptor number leaves the channel to the socket", "[sdk]") {
  for (const char* bad : {"", "-1", "x", "3x", "99999999999"}) {
    INFO(bad);
    CHECK(Env::fromEnvironment(with(goodVars(), "DDPRUN_HEARTBEAT_FD", bad)).heartbeatFd == -1);
  }
  CHECK(Env::fromEnvironment(with(goodVars(), "DDPRUN_HEARTBEAT_FD", "12")).heartbeatFd == 12);
}
