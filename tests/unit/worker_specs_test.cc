// WorkerSpecs: the run folder's layout, the round's file store, and the heartbeat channel each
// worker is started with.
#include "agent/worker_specs.h"

#include <catch2/catch.hpp>
#include <filesystem>

#include "test_util.h"

using ddprun::AgentOptions;
using ddprun::RoundInfo;
using ddprun::WorkerChannelEnd;
using ddprun::WorkerSpecs;

namespace {

AgentOptions options(const std::string& runDir, bool flat) {
  AgentOptions o;
  o.executable = "/bin/true";
  o.nprocPerNode = 2;
  o.runId = "job";
  o.runDir = runDir;
  o.flatRunDir = flat;
  return o;
}

RoundInfo round(uint64_t n, int restartCount) {
  RoundInfo r;
  r.round = n;
  r.restartCount = restartCount;
  r.rankOffset = 4;
  r.worldSize = 6;
  return r;
}

}  // namespace

TEST_CASE("worker specs: torchrun's attempt_N/<local rank>/ layout, or flat in ddprun's own folder", "[agent]") {
  ddprun::test::TempDir dir;
  const AgentOptions nested = options(dir.path(), false);
  const auto specs = WorkerSpecs(nested).make(round(3, 1), nullptr);
  REQUIRE(specs.size() == 2);
  CHECK(specs[1].rank == 5);
  CHECK(specs[1].errorFile == dir.path() + "/attempt_1/1/error.json");
  CHECK(specs[1].flightRecorder == dir.path() + "/attempt_1/1/flight_recorder");
  CHECK(std::filesystem::is_directory(dir.path() + "/attempt_1/1"));
  CHECK(specs[1].request.inheritFd == -1);
  CHECK_FALSE(specs[1].request.env.get("DDPRUN_HEARTBEAT_FD"));

  const AgentOptions flat = options(dir.path(), true);
  const auto flatSpecs = WorkerSpecs(flat).make(round(3, 2), nullptr);
  CHECK(flatSpecs[0].errorFile == dir.path() + "/attempt_2.0.error.json");
  CHECK_FALSE(std::filesystem::exists(dir.path() + "/attempt_2"));
}

TEST_CASE("worker specs: each worker gets its own heartbeat channel", "[agent]") {
  ddprun::test::TempDir dir;
  const AgentOptions o = options(dir.path(), true);
  std::vector<int> opened;
  const auto specs = WorkerSpecs(o).make(round(1, 0), [&](int localRank) {
    opened.push_back(localRank);
    return WorkerChannelEnd{10 + localRank, {{"DDPRUN_HEARTBEAT_FD", std::to_string(10 + localRank)},
                                             {"DDPRUN_HEARTBEAT_SOCKET", "@hb"}}};
  });
  CHECK(opened == std::vector<int>{0, 1});
  CHECK(specs[1].request.inheritFd == 11);
  CHECK(specs[1].request.env.get("DDPRUN_HEARTBEAT_FD") == "11");
  CHECK(specs[1].request.env.get("DDPRUN_HEARTBEAT_SOCKET") == "@hb");
}

TEST_CASE("worker specs: a single node's store is an empty folder per round", "[agent]") {
  ddprun::test::TempDir dir;
  const AgentOptions o = options(dir.path(), false);
  RoundInfo r = round(7, 0);
  const std::string folder = dir.path() + "/store/round_7";
  std::filesystem::create_directories(folder + "/stale");
  WorkerSpecs(o).placeFileStore(r);
  CHECK(r.storeAddr == "file://" + folder);
  CHECK(r.storePrefix == "/run/job/round/7/");
  CHECK(std::filesystem::is_empty(folder));
}
