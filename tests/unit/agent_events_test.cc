// The agent's events (agent/agent_events.h) as its observers (the --timeline file, the metrics
// port) see them: an agent over a fake supervisor runs a failure, a restart and a success, and the
// timeline's JSON lines say so in order, with ranks, pids and exit codes.
#include <boost/json.hpp>
#include <catch2/catch.hpp>

#include "agent/timeline.h"
#include "agent_harness.h"

using ddprun::AgentEvent;
using ddprun::AgentObserver;
using ddprun::test::AgentHarness;
using ddprun::test::AgentSetup;

namespace {

struct Recorder final : AgentObserver {
  std::vector<AgentEvent> events;
  std::vector<std::pair<int, double>> steps;
  void onEvent(const AgentEvent& e) override { events.push_back(e); }
  void onStep(int localRank, double seconds) override { steps.emplace_back(localRank, seconds); }
};

// "kind rank code": the events in order, each in a few words.
std::vector<std::string> render(const std::vector<AgentEvent>& events) {
  std::vector<std::string> out;
  for (const auto& e : events) {
    std::string line = ddprun::agentEventName(e.kind);
    if (e.round) line += " r" + std::to_string(e.round);
    if (e.rank >= 0) line += " rank" + std::to_string(e.rank);
    if (e.kind == AgentEvent::Kind::kWorkerFailed) line += " " + e.cause + ":" + std::to_string(e.exitStatus);
    if (e.kind == AgentEvent::Kind::kJobEnded) line += " exit " + std::to_string(e.exitStatus);
    out.push_back(line);
  }
  return out;
}

}  // namespace

TEST_CASE("agent events: a failure, a restart and a success, in order", "[agent][events]") {
  auto recorder = std::make_shared<Recorder>();
  AgentHarness h(AgentSetup{.nproc = 2, .maxRestarts = 1, .observers = {recorder}});
  h.start();
  REQUIRE(h.supervisor.spawned().size() == 2);
  h.supervisor.exitProcess(1000, 3);
  h.pump();
  h.supervisor.killProcess(1001, SIGTERM);
  h.pump();
  REQUIRE(h.supervisor.spawned().size() == 4);
  h.supervisor.exitProcess(1002, 0);
  h.supervisor.exitProcess(1003, 0);
  h.pump();
  REQUIRE(h.status() == 0);
  CHECK(render(recorder->events) ==
        std::vector<std::string>{"joining", "round_formed r1", "worker_started r1 rank0", "worker_started r1 rank1",
                                 "worker_failed r1 rank0 worker_exit:3", "round_interrupted r1", "round_formed r2",
                                 "worker_started r2 rank0",
                                 "worker_started r2 rank1", "worker_succeeded r2 rank0", "worker_succeeded r2 rank1",
                                 "job_ended r2 exit 0"});
  CHECK(recorder->events[2].pid == 1000);
  CHECK(recorder->events[4].localRank == 0);
  CHECK(recorder->events[6].restartCount == 1);
  CHECK(recorder->events.back().node == "testhost");  // no node id: the host
  for (const auto& e : recorder->events) CHECK(e.time.time_since_epoch().count() > 0);
}

TEST_CASE("agent events: a worker killed by a signal ends the job with 128+N", "[agent][events]") {
  auto recorder = std::make_shared<Recorder>();
  AgentHarness h(AgentSetup{.nproc = 1, .observers = {recorder}});
  h.start();
  h.supervisor.killProcess(1000, SIGSEGV);
  h.pump();
  REQUIRE(h.status() == 128 + SIGSEGV);
  CHECK(render(recorder->events) == std::vector<std::string>{"joining", "round_formed r1", "worker_started r1 rank0",
                                                             "worker_failed r1 rank0 signal:139", "job_ended r1 exit 139"});
  CHECK(recorder->events[3].signal == SIGSEGV);
}

TEST_CASE("timeline: one JSON object per line, with each kind's fields", "[agent][events]") {
  ddprun::test::TempDir dir;
  const std::string path = dir.path() + "/timeline.jsonl";
  {
    ddprun::TimelineWriter timeline(path);
    AgentEvent formed;
    formed.kind = AgentEvent::Kind::kRoundFormed;
    formed.seq = 3;
    formed.node = "h:1:2";
    formed.round = 1;
    formed.groupRank = 1;
    formed.groupWorldSize = 2;
    formed.worldSize = 4;
    formed.members = {"a", "h:1:2"};
    timeline.onEvent(formed);
    AgentEvent failed;
    failed.kind = AgentEvent::Kind::kWorkerFailed;
    failed.seq = 3;
    failed.round = 1;
    failed.rank = 2;
    failed.localRank = 0;
    failed.pid = 77;
    failed.exitCode = 3;
    failed.exitStatus = 3;
    failed.cause = "worker_exit";
    failed.reason = "failed with exit code 3";
    timeline.onEvent(failed);
  }
  std::ifstream in(path);
  std::string first, second, third;
  REQUIRE(std::getline(in, first));
  REQUIRE(std::getline(in, second));
  CHECK_FALSE(std::getline(in, third));
  auto a = boost::json::parse(first).as_object();
  CHECK(a.at("event") == "round_formed");
  CHECK(a.at("seq") == 3);
  CHECK(a.at("n") == 1);
  CHECK(a.at("node") == "h:1:2");
  CHECK(a.at("members").as_array().size() == 2);
  CHECK(a.at("world_size") == 4);
  CHECK(a.at("time").as_string().size() == std::string("2026-11-27T10:15:57.206Z").size());
  auto b = boost::json::parse(second).as_object();
  CHECK(b.at("event") == "worker_failed");
  CHECK(b.at("n") == 2);
  CHECK(b.at("exit_code") == 3);
  CHECK(b.at("pid") == 77);
  CHECK(b.at("cause") == "worker_exit");
  CHECK_FALSE(b.contains("signal"));
}

TEST_CASE("timeline: a path that cannot be written is a configuration error", "[agent][events]") {
  CHECK_THROWS_AS(ddprun::TimelineWriter("/nonexistent-dir/timeline.jsonl"), ddprun::ConfigError);
}
