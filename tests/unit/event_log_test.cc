// The torchelastic status events at the end of a run (agent/event_log.h), in torch's format.
#include "agent/event_log.h"

#include <boost/json.hpp>
#include <catch2/catch.hpp>

using ddprun::StatusEvent;

TEST_CASE("status events: the agent's line, as torch's SimpleElasticAgent records it", "[agent][events]") {
  StatusEvent base;
  base.runId = "job";
  base.role = "default";
  base.hostname = "host-a";
  base.rdzvBackend = "c10d";
  base.entryPoint = "train.py";
  base.groupRank = 1;
  base.groupWorldSize = 2;
  base.agentRestarts = 3;
  base.totalRunTimeS = 12.7;
  base.timestampMs = 1700000000000;
  const std::string failed = ddprun::formatRunEndEvents(base, nullptr, 2, 4, 7);
  REQUIRE(failed.back() == '\n');
  const auto event = boost::json::parse(failed).as_object();
  CHECK(event.at("name") == "torchelastic.worker.status.FAILED");
  CHECK(event.at("source") == "AGENT");
  const auto& meta = event.at("metadata").as_object();
  CHECK(meta.at("run_id") == "job");
  CHECK(meta.at("group_rank") == 1);
  CHECK(meta.at("agent_restarts") == 3);
  CHECK(meta.at("total_run_time") == 12);
  CHECK(meta.at("global_rank").is_null());
  CHECK_THAT(ddprun::formatRunEndEvents(base, nullptr, 2, 4, 0), Catch::Contains("status.SUCCEEDED"));
}

TEST_CASE("status events: a worker's details sit in a nested JSON string of 1-tuples, as torch's", "[agent][events]") {
  StatusEvent e;
  e.state = "FAILED";
  e.localRank = 1;
  e.globalRank = 5;
  e.pid = 4242;
  e.exitCode = -9;
  const auto event = boost::json::parse(ddprun::formatStatusEvent(e)).as_object();
  CHECK(event.at("source") == "WORKER");
  const auto& meta = event.at("metadata").as_object();
  CHECK(meta.at("worker_id") == "4242");
  const auto nested = boost::json::parse(meta.at("metadata").as_string()).as_object();
  CHECK(nested.at("exit_code") == boost::json::array{-9});
  CHECK(nested.at("role_rank") == boost::json::array{5});
}
