#include "agent/elastic_agent.h"

#include <signal.h>

#include <boost/asio/io_context.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <optional>

#include "agent_harness.h"

using ddprun::AgentOptions;
using ddprun::ElasticAgent;
using ddprun::LocalRendezvous;
using ddprun::LocalRendezvousOptions;
using ddprun::test::AgentHarness;
using ddprun::test::AgentSetup;
using ddprun::test::FakeProcessSupervisor;
using ddprun::test::FenceableRendezvous;
using ddprun::test::OutputCapture;
using ddprun::test::TempDir;
using namespace std::chrono_literals;

TEST_CASE("agent starts one worker per local rank with torchrun's environment", "[agent]") {
  AgentHarness h(AgentSetup{.nproc = 2});
  h.start();
  REQUIRE(h.supervisor.spawned().size() == 2);
  CHECK(h.supervisor.hasExitHandler());
  for (size_t i = 0; i < 2; ++i) {
    const auto& request = h.supervisor.spawned()[i].request;
    CHECK(request.executable == "/bin/true");
    CHECK(request.args == std::vector<std::string>{"--epochs", "1"});
    CHECK(h.envOf(i, "RANK") == std::to_string(i));
    CHECK(h.envOf(i, "LOCAL_RANK") == std::to_string(i));
    CHECK(h.envOf(i, "WORLD_SIZE") == "2");
    CHECK(h.envOf(i, "LOCAL_WORLD_SIZE") == "2");
    CHECK(h.envOf(i, "MASTER_ADDR") == "127.0.0.1");
    CHECK(h.envOf(i, "MASTER_PORT") == "50000");
    CHECK(h.envOf(i, "TORCHELASTIC_RESTART_COUNT") == "0");
    CHECK(h.envOf(i, "TORCHELASTIC_RUN_ID") == "test-run-id");
    CHECK(h.envOf(i, "DDPRUN_ROUND") == "1");
    CHECK(h.envOf(i, "MY_VAR") == "kept");
    std::string errorFile = h.envOf(i, "TORCHELASTIC_ERROR_FILE");
    CHECK(errorFile == h.runDir.path() + "/attempt_0/" + std::to_string(i) + "/error.json");
    CHECK(std::filesystem::is_directory(std::filesystem::path(errorFile).parent_path()));
  }
  CHECK_FALSE(h.status().has_value());
}

TEST_CASE("agent passes torch.distributed.launch's --local_rank=N to each worker where launch put it", "[agent]") {
  // args as resolved for "script.py --epochs 1": [-u, script.py, --epochs, 1]; the flag goes after the script.
  AgentHarness h(AgentSetup{.nproc = 3, .localRankArg = "--local-rank", .localRankArgAt = 0});
  h.start();
  REQUIRE(h.supervisor.spawned().size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(h.supervisor.spawned()[i].request.args ==
          std::vector<std::string>{"--local-rank=" + std::to_string(i), "--epochs", "1"});
    CHECK(h.envOf(i, "LOCAL_RANK") == std::to_string(i));  // the environment contract stays
  }
  AgentHarness atEnd(AgentSetup{.nproc = 2, .localRankArg = "--local_rank", .localRankArgAt = 2});
  atEnd.start();
  REQUIRE(atEnd.supervisor.spawned().size() == 2);
  CHECK(atEnd.supervisor.spawned()[1].request.args == std::vector<std::string>{"--epochs", "1", "--local_rank=1"});
}

TEST_CASE("agent finishes with 0 when every worker exits 0", "[agent]") {
  AgentHarness h(AgentSetup{.nproc = 2});
  h.start();
  h.supervisor.exitProcess(1000, 0);
  h.pump();
  CHECK_FALSE(h.status().has_value());
  h.supervisor.exitProcess(1001, 0);
  h.pump();
  CHECK(h.statuses == std::vector<int>{0});
  CHECK(h.supervisor.signals().empty());
  CHECK(h.supervisor.spawned().size() == 2);
  REQUIRE_FALSE(h.supervisor.sweeps().empty());
  CHECK(h.supervisor.sweeps().back() == std::vector<pid_t>{1000, 1001});
}

TEST_CASE("agent stops the others when a worker fails and finishes with its exit code", "[agent]") {
  AgentHarness h(AgentSetup{.nproc = 3, .maxRestarts = 0});
  h.start();
  h.supervisor.exitProcess(1001, 3);
  h.pump();
  CHECK(h.supervisor.signalsTo(1000) == std::vector<int>{SIGTERM});
  CHECK(h.supervisor.signalsTo(1001).empty());
  CHECK(h.supervisor.signalsTo(1002) == std::vector<int>{SIGTERM});
  CHECK_FALSE(h.status().has_value());  // not before the others are gone

  h.supervisor.killProcess(1000, SIGTERM);
  h.pump();
  CHECK_FALSE(h.status().has_value());
  h.supervisor.killProcess(1002, SIGTERM);
  h.pump();
  CHECK(h.statuses == std::vector<int>{3});
  CHECK(h.supervisor.spawned().size() == 3);  // no restart
  CHECK(h.supervisor.signalsTo(1000) == std::vector<int>{SIGTERM});  // no SIGKILL needed

  std::string summary = h.errText();
  CHECK_THAT(summary, Catch::Contains("train_prog FAILED"));
  CHECK_THAT(summary, Catch::Contains("rank      : 1 (local_rank: 1)"));
  CHECK_THAT(summary, Catch::Contains("exitcode  : 3"));
  CHECK_THAT(summary, Catch::Contains("pid       : 1001"));
  CHECK_THAT(summary, Catch::Contains("testhost"));
  CHECK_THAT(summary, !Catch::Contains("Other failures"));  // SIGTERMed workers were stopped, not failed
}

TEST_CASE("agent finishes with 128+N when a worker is killed by signal N", "[agent]") {
  AgentHarness h(AgentSetup{.nproc = 2, .maxRestarts = 0});
  h.start();
  h.supervisor.killProcess(1000, SIGKILL);
  h.pump();
  CHECK(h.supervisor.signalsTo(1001) == std::vector<int>{SIGTERM});
  h.supervisor.exitProcess(1001, 0);
  h.pump();
  CHECK(h.statuses == std::vector<int>{137});
  CHECK_THAT(h.errText(), Catch::Contains("SIGKILL"));
}

TEST_CASE("agent with one worker that fails finishes with its exit code", "[agent]") {
  AgentHarness h(AgentSetup{.nproc = 1, .maxRestarts = 0});
  h.start();
  h.supervisor.exitProcess(1000, 42);
  h.pump();
  CHECK(h.statuses == std::vector<int>{42});
  CHECK(h.supervisor.signals().empty());
}

TEST_CASE("agent restarts the workers while the budget lasts, then fails with the last code", "[agent]") {
  AgentHarness h(AgentSetup{.nproc = 2, .maxRestarts = 2});
  h.start();
  REQUIRE(h.supervisor.spawned().size() == 2);

  // Attempt 0 fails.
  h.supervisor.exitProcess(1000, 3);
  h.pump();
  CHECK(h.supervisor.signalsTo(1001) == std::vector<int>{SIGTERM});
  CHECK(h.supervisor.spawned().size() == 2);  // not before the old workers are gone
  h.supervisor.killProcess(1001, SIGTERM);
  h.pump();
  REQUIRE(h.supervisor.spawned().size() == 4);
  CHECK(h.supervisor.lastPids(2) == std::vector<pid_t>{1002, 1003});
  for (size_t i : {2, 3}) {
    CHECK(h.envOf(i, "TORCHELASTIC_RESTART_COUNT") == "1");
    CHECK(h.envOf(i, "TORCHELASTIC_MAX_RESTARTS") == "2");
    CHECK(h.envOf(i, "DDPRUN_ROUND") == "2");
    CHECK(h.envOf(i, "MASTER_PORT") == "50001");  // a fresh port for the new round
    CHECK(h.envOf(i, "RANK") == std::to_string(i - 2));
    CHECK_THAT(h.envOf(i, "TORCHELASTIC_ERROR_FILE"), Catch::Contains("/attempt_1/"));
  }
  CHECK_FALSE(h.status().has_value());

  // Attempt 1 fails.
  h.supervisor.exitProcess(1003, 4);
  h.pump();
  CHECK(h.supervisor.signalsTo(1002) == std::vector<int>{SIGTERM});
  h.supervisor.killProcess(1002, SIGTERM);
  h.pump();
  REQUIRE(h.supervisor.spawned().size() == 6);
  CHECK(h.envOf(4, "TORCHELASTIC_RESTART_COUNT") == "2");
  CHECK(h.envOf(5, "DDPRUN_ROUND") == "3");
  CHECK(h.envOf(5, "MASTER_PORT") == "50002");

  // Attempt 2 fails: the budget is spent.
  h.supervisor.exitProcess(1004, 5);
  h.pump();
  CHECK(h.supervisor.signalsTo(1005) == std::vector<int>{SIGTERM});
  h.supervisor.killProcess(1005, SIGTERM);
  h.pump();
  CHECK(h.statuses == std::vector<int>{5});
  CHECK(h.supervisor.spawned().size() == 6);
  CHECK_THAT(h.errText(), Catch::Contains("exitcode  : 5"));
}

TEST_CASE("agent succeeds when a restarted attempt succeeds", "[agent]") {
  AgentHarness h(AgentSetup{.nproc = 2, .maxRestarts = 1});
  h.start();
  h.supervisor.exitProcess(1001, 1);
  h.pump();
  h.supervisor.exitProcess(1000, 0);  // exited by itself while being stopped
  h.pump();
  REQUIRE(h.supervisor.spawned().size() == 4);
  h.supervisor.exitProcess(1002, 0);
  h.supervisor.exitProcess(1003, 0);
  h.pump();
  CHECK(h.statuses == std::vector<int>{0});
}

TEST_CASE("two workers failing together cost one restart, not two", "[agent]") {
  AgentHarness h(AgentSetup{.nproc = 2, .maxRestarts = 3});
  h.start();
  h.supervisor.exitProcess(1000, 1);
  h.supervisor.exitProcess(1001, 2);
  h.pump();
  REQUIRE(h.supervisor.spawned().size() == 4);
  CHECK(h.envOf(2, "TORCHELASTIC_RESTART_COUNT") == "1");
  CHECK(h.envOf(2, "DDPRUN_ROUND") == "2");
  // 1001 was still running when 1000's failure arrived; its own failure came during the stop.
  CHECK(h.supervisor.signalsTo(1000).empty());
  CHECK(h.supervisor.signalsTo(1001) == std::vector<int>{SIGTERM});
}

TEST_CASE("a fixed master port is kept across restarts", "[agent]") {
  AgentHarness h(AgentSetup{.nproc = 1, .maxRestarts = 1, .masterPort = 29500});
  h.start();
  CHECK(h.envOf(0, "MASTER_PORT") == "29500");
  h.supervisor.exitProcess(1000, 1);
  h.pump();
  REQUIRE(h.supervisor.spawned().size() == 2);
  CHECK(h.envOf(1, "MASTER_PORT") == "29500");
  CHECK(h.nextPort == 50000);  // no port was searched
}

TEST_CASE("agent forwards SIGTERM to every worker and finishes with 143", "[agent]") {
  AgentHarness h(AgentSetup{.nproc = 2, .maxRestarts = 3});
  h.start();
  h.agent->handleSignal(SIGTERM);
  CHECK(h.supervisor.signalsTo(1000) == std::vector<int>{SIGTERM});
  CHECK(h.supervisor.signalsTo(1001) == std::vector<int>{SIGTERM});
  h.pump();
  CHECK_FALSE(h.status().has_value());
  h.supervisor.killProcess(1000, SIGTERM);
  h.supervisor.exitProcess(1001, 1);  // a worker's own exit while stopping is no failure
  h.pump();
  CHECK(h.statuses == std::vector<int>{143});
  CHECK(h.supervisor.spawned().size() == 2);  // a signal never restarts
}

TEST_CASE("a second SIGINT within a second sends SIGKILL at once", "[agent]") {
  AgentHarness h(AgentSetup{.nproc = 2});
  h.start();
  h.agent->handleSignal(SIGINT);
  CHECK(h.supervisor.signalsTo(1000) == std::vector<int>{SIGINT});
  CHECK(h.supervisor.signalsTo(1001) == std::vector<int>{SIGINT});
  h.agent->handleSignal(SIGINT);
  CHECK(h.supervisor.signalsTo(1000) == std::vector<int>{SIGINT, SIGKILL});
  CHECK(h.supervisor.signalsTo(1001) == std::vector<int>{SIGINT, SIGKILL});
  h.supervisor.killProcess(1000, SIGKILL);
  h.supervisor.killProcess(1001, SIGKILL);
  h.pump();
  CHECK(h.statuses == std::vector<int>{130});
}

TEST_CASE("workers that ignore a forwarded signal get SIGKILL after the grace", "[agent]") {
  AgentHarness h(AgentSetup{.nproc = 2, .grace = 20ms});
  h.start();
  h.agent->handleSignal(SIGTERM);
  h.io.restart();
  h.io.run_for(2s);  // returns once the kill timer has fired
  CHECK(h.supervisor.signalsTo(1000) == std::vector<int>{SIGTERM, SIGKILL});
  CHECK(h.supervisor.signalsTo(1001) == std::vector<int>{SIGTERM, SIGKILL});
  h.supervisor.killProcess(1000, SIGKILL);
  h.supervisor.killProcess(1001, SIGKILL);
  h.pump();
  CHECK(h.statuses == std::vector<int>{143});
}

TEST_CASE("a signal before the workers start finishes at once and starts nothing", "[agent]") {
  AgentHarness h(AgentSetup{.nproc = 2});
  h.agent->start([&h](int status) { h.statuses.push_back(status); });
  h.agent->handleSignal(SIGTERM);
  h.pump();
  CHECK(h.statuses == std::vector<int>{143});
  CHECK(h.supervisor.spawned().empty());
}

TEST_CASE("agent finishes exactly once", "[agent]") {
  AgentHarness h(AgentSetup{.nproc = 1});
  h.start();
  h.supervisor.exitProcess(1000, 0);
  h.pump();
  h.agent->handleSignal(SIGTERM);
  h.agent->onJobClosed(ddprun::JobClosure{ddprun::JobOutcome::kFailed, "late", {}, {}});
  h.pump();
  CHECK(h.statuses == std::vector<int>{0});
  CHECK(h.supervisor.signals().empty());
}

TEST_CASE("a worker that cannot be spawned fails the job with 127", "[agent]") {
  AgentHarness h(AgentSetup{.nproc = 2});
  h.supervisor.failSpawnNumber(1);
  h.start();
  REQUIRE(h.supervisor.spawned().size() == 1);
  CHECK(h.supervisor.signalsTo(1000) == std::vector<int>{SIGTERM});
  h.supervisor.killProcess(1000, SIGTERM);
  h.pump();
  CHECK(h.statuses == std::vector<int>{127});
  CHECK_THAT(h.errText(), Catch::Contains("could not start"));
}

TEST_CASE("the failure summary shows the worker's error file and last stderr lines", "[agent]") {
  AgentHarness h(AgentSetup{.nproc = 2, .keepOutputFds = true});
  h.start();
  std::string errorFile = h.envOf(1, "TORCHELASTIC_ERROR_FILE");
  ddprun::test::writeFile(errorFile,
                          R"({"message": {"message": "ValueError: boom", "extraInfo": {"py_callstack": )"
                          R"("Traceback (most recent call last):\n  File \"train.py\", line 9\nValueError: boom", )"
                          R"("timestamp": "1700000000"}}})");
  REQUIRE(h.supervisor.writeStderr(1001, "loading data\nabout to raise\n"));
  h.supervisor.exitProcess(1001, 1);
  h.pump();
  h.supervisor.killProcess(1000, SIGTERM);
  h.pump();
  CHECK(h.statuses == std::vector<int>{1});
  std::string text = h.errText();
  CHECK_THAT(text, Catch::Contains("[default1]:about to raise"));  // the console copy
  CHECK_THAT(text, Catch::Contains("message   : ValueError: boom"));
  CHECK_THAT(text, Catch::Contains("Traceback (most recent call last):"));
  CHECK_THAT(text, Catch::Contains("File \"train.py\", line 9"));
  CHECK_THAT(text, Catch::Contains(errorFile));
  CHECK_THAT(text, Catch::Contains("stderr (last 2 lines):\n      loading data\n      about to raise\n"));
}

TEST_CASE("the failure summary lists other workers that failed on their own", "[agent]") {
  AgentHarness h(AgentSetup{.nproc = 3});
  h.start();
  h.supervisor.exitProcess(1000, 3);
  h.pump();
  h.supervisor.exitProcess(1001, 4);   // failed by itself while being stopped
  h.supervisor.killProcess(1002, SIGTERM);
  h.pump();
  CHECK(h.statuses == std::vector<int>{3});
  std::string text = h.errText();
  CHECK_THAT(text, Catch::Contains("rank 1 (local_rank: 1): exitcode 4"));
  CHECK_THAT(text, !Catch::Contains("rank 2 (local_rank: 2)"));
}

TEST_CASE("in the agent's own temporary folder a rank's files lie flat, and a failure's error file is read there", "[agent]") {
  AgentHarness h(AgentSetup{.nproc = 2, .maxRestarts = 1, .flatRunDir = true});
  h.start();
  REQUIRE(h.supervisor.spawned().size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    CHECK(h.envOf(i, "TORCHELASTIC_ERROR_FILE") == h.runDir.path() + "/attempt_0." + std::to_string(i) + ".error.json");
    CHECK(h.envOf(i, "DDPRUN_FLIGHT_RECORDER") == h.runDir.path() + "/attempt_0." + std::to_string(i) + ".flight_recorder");
  }
  CHECK(h.envOf(0, "DDPRUN_STORE_ADDR").empty() == false);
  // No folder per attempt or per rank: one for the round's store, nothing else.
  std::vector<std::string> folders;
  for (const auto& entry : std::filesystem::directory_iterator(h.runDir.path())) {
    if (entry.is_directory()) folders.push_back(entry.path().filename().string());
  }
  CHECK(folders == std::vector<std::string>{"store_round_1"});
  // The restarted attempt has files of its own.
  h.supervisor.exitProcess(1001, 3);
  h.pump();
  h.supervisor.killProcess(1000, SIGTERM);
  h.pump();
  REQUIRE(h.supervisor.spawned().size() == 4);
  CHECK(h.envOf(2, "TORCHELASTIC_ERROR_FILE") == h.runDir.path() + "/attempt_1.0.error.json");
  // A failure of the last attempt shows the error file it wrote there.
  ddprun::test::writeFile(h.envOf(3, "TORCHELASTIC_ERROR_FILE"), R"({"message": "FLAT ERROR FILE"})");
  h.supervisor.exitProcess(1003, 2);
  h.pump();
  h.supervisor.killProcess(1002, SIGTERM);
  h.pump();
  CHECK_THAT(h.errText(), Catch::Contains("FLAT ERROR FILE"));
  CHECK(h.statuses == std::vector<int>{2});
}

TEST_CASE("a stale error file from an earlier run is removed before the workers start", "[agent]") {
  AgentHarness h(AgentSetup{.nproc = 1});
  std::string stale = h.runDir.path() + "/attempt_0/0/error.json";
  std::filesystem::create_directories(std::filesystem::path(stale).parent_path());
  ddprun::test::writeFile(stale, R"({"message": "STALE MESSAGE"})");
  h.start();
  CHECK_FALSE(std::filesystem::exists(stale));
  h.supervisor.exitProcess(1000, 2);
  h.pump();
  CHECK(h.statuses == std::vector<int>{2});
  CHECK_THAT(h.errText(), !Catch::Contains("STALE MESSAGE"));
}

TEST_CASE("an interrupted round stops the workers and the next round starts them again", "[agent]") {
  AgentHarness h(AgentSetup{.nproc = 2});
  h.start();
  h.agent->onRoundInterrupted(7, "a round that is not running");
  CHECK(h.supervisor.signals().empty());
  h.agent->onRoundInterrupted(1, "a peer left");
  CHECK(h.supervisor.signalsTo(1000) == std::vector<int>{SIGTERM});
  CHECK(h.supervisor.signalsTo(1001) == std::vector<int>{SIGTERM});

  ddprun::RoundInfo next;
  next.round = 2;
  next.restartCount = 0;
  next.groupRank = 1;
  next.groupWorldSize = 2;
  next.rankOffset = 2;
  next.worldSize = 4;
  next.masterAddr = "10.0.0.1";
  next.masterPort = 29501;
  h.agent->onRoundReady(next);
  CHECK(h.supervisor.spawned().size() == 2);  // not while the old workers live
  h.supervisor.killProcess(1000, SIGTERM);
  h.supervisor.killProcess(1001, SIGTERM);
  h.pump();
  REQUIRE(h.supervisor.spawned().size() == 4);
  CHECK(h.envOf(2, "RANK") == "2");
  CHECK(h.envOf(3, "RANK") == "3");
  CHECK(h.envOf(3, "LOCAL_RANK") == "1");
  CHECK(h.envOf(3, "WORLD_SIZE") == "4");
  CHECK(h.envOf(3, "GROUP_RANK") == "1");
  CHECK(h.envOf(3, "MASTER_ADDR") == "10.0.0.1");
  CHECK(h.envOf(3, "DDPRUN_ROUND") == "2");
  CHECK_FALSE(h.status().has_value());
}

TEST_CASE("hand-over: an interruption is answered with reportStopped only once every worker is gone", "[agent]") {
  AgentHarness h(AgentSetup{.nproc = 2});
  h.start();
  h.agent->onRoundInterrupted(1, "a node joined");
  h.pump();
  CHECK(h.fenceable.stoppedReports.empty());
  h.supervisor.killProcess(1000, SIGTERM);
  h.pump();
  CHECK(h.fenceable.stoppedReports.empty());  // one worker still runs
  h.supervisor.exitProcess(1001, 0);
  h.pump();
  CHECK(h.fenceable.stoppedReports == std::vector<uint64_t>{1});
  CHECK_FALSE(h.status().has_value());
}

TEST_CASE("hand-over: an interruption while no worker runs is answered at once", "[agent]") {
  AgentHarness h(AgentSetup{.nproc = 1, .maxRestarts = 0});
  h.start();
  h.agent->onRoundInterrupted(1, "a peer failed");
  h.supervisor.killProcess(1000, SIGTERM);
  h.pump();
  REQUIRE(h.fenceable.stoppedReports == std::vector<uint64_t>{1});
  h.agent->onRoundInterrupted(1, "the same interruption again");
  CHECK(h.fenceable.stoppedReports == std::vector<uint64_t>{1, 1});
  h.agent->onRoundInterrupted(5, "a round this node was never told of");
  CHECK(h.fenceable.stoppedReports == std::vector<uint64_t>{1, 1});
}

TEST_CASE("hand-over: a round interrupted before its workers started never starts them", "[agent]") {
  AgentHarness h(AgentSetup{.nproc = 1});
  h.start();
  h.agent->onRoundInterrupted(1, "a peer left");
  ddprun::RoundInfo next;
  next.round = 2;
  next.masterAddr = "10.0.0.1";
  next.masterPort = 29501;
  h.agent->onRoundReady(next);  // waits for round 1's worker
  h.agent->onRoundInterrupted(2, "another peer left");
  h.supervisor.killProcess(1000, SIGTERM);
  h.pump();
  CHECK(h.supervisor.spawned().size() == 1);
  CHECK(h.fenceable.stoppedReports == std::vector<uint64_t>{2});  // one answer covers both rounds
}

TEST_CASE("hand-over: a node stopped by a signal leaves at once and reports its workers stopped before it finishes",
          "[agent]") {
  AgentHarness h(AgentSetup{.nproc = 2});
  h.start();
  h.agent->handleSignal(SIGTERM);
  h.pump();
  CHECK(h.fenceable.leaves == 1);
  CHECK(h.fenceable.stoppedReports.empty());
  h.supervisor.killProcess(1000, SIGTERM);
  h.supervisor.killProcess(1001, SIGTERM);
  h.pump();
  CHECK(h.fenceable.stoppedReports == std::vector<uint64_t>{1});
  CHECK(h.statuses == std::vector<int>{143});
}

TEST_CASE("an exit of a pid the agent does not know is ignored", "[agent]") {
  AgentHarness h(AgentSetup{.nproc = 1});
  h.start();
  h.supervisor.exitProcess(4242, 1);
  h.pump();
  CHECK_FALSE(h.status().has_value());
  CHECK(h.supervisor.signals().empty());
  h.supervisor.exitProcess(1000, 0);
  h.pump();
  CHECK(h.statuses == std::vector<int>{0});
}

TEST_CASE("agent passes the role and virtual local rank to the workers", "[agent]") {
  AgentHarness h(AgentSetup{.nproc = 2, .virtualLocalRank = true, .role = "trainer"});
  h.start();
  REQUIRE(h.supervisor.spawned().size() == 2);
  CHECK(h.envOf(1, "ROLE_NAME") == "trainer");
  CHECK(h.envOf(1, "LOCAL_RANK") == "0");
  CHECK(h.envOf(1, "RANK") == "1");
  CHECK(h.envOf(1, "CUDA_VISIBLE_DEVICES") == "1");
}

TEST_CASE("redirects send a worker's output to its files, not to the console", "[agent][logs]") {
  ddprun::LogOptions log;
  log.redirects = ddprun::StreamSpec::parse("0:1", "--redirects");  // rank 0's stdout: file only
  log.tee = ddprun::StreamSpec::parse("0:2", "--tee");              // rank 0's stderr: file and console
  log.prefixTemplate = "<{rank}>";
  OutputCapture out(1);
  AgentHarness h(AgentSetup{.nproc = 2, .keepOutputFds = true, .log = log});
  h.start();
  REQUIRE(h.supervisor.writeStdout(1000, "rank0 stdout\n"));
  REQUIRE(h.supervisor.writeStderr(1000, "rank0 stderr\n"));
  REQUIRE(h.supervisor.writeStdout(1001, "rank1 stdout\n"));
  h.supervisor.exitProcess(1000, 0);
  h.supervisor.exitProcess(1001, 0);
  h.pump();
  CHECK(h.statuses == std::vector<int>{0});
  std::string dir0 = h.runDir.path() + "/attempt_0/0/";
  std::string dir1 = h.runDir.path() + "/attempt_0/1/";
  CHECK(ddprun::test::readFile(dir0 + "stdout.log") == "rank0 stdout\n");  // raw, unprefixed
  CHECK(ddprun::test::readFile(dir0 + "stderr.log") == "rank0 stderr\n");
  CHECK_FALSE(std::filesystem::exists(dir1 + "stdout.log"));  // rank 1 asked for no files
  CHECK_FALSE(std::filesystem::exists(dir1 + "stderr.log"));
  h.flushStdout();
  std::string console = out.text();
  out.restore();
  CHECK_THAT(console, !Catch::Contains("rank0 stdout"));
  CHECK_THAT(console, Catch::Contains("<1>rank1 stdout\n"));
  CHECK_THAT(h.errText(), Catch::Contains("<0>rank0 stderr\n"));
}

TEST_CASE("local_ranks_filter hides the other ranks from the console, --log_dir keeps files", "[agent][logs]") {
  ddprun::LogOptions log;
  log.consoleRanks = {1};
  AgentHarness h(AgentSetup{.nproc = 2, .keepOutputFds = true, .log = log, .writeLogFiles = true});
  h.start();
  REQUIRE(h.supervisor.writeStderr(1000, "from rank zero\n"));
  REQUIRE(h.supervisor.writeStderr(1001, "from rank one\n"));
  h.supervisor.exitProcess(1000, 0);
  h.supervisor.exitProcess(1001, 0);
  h.pump();
  std::string console = h.errText();
  CHECK_THAT(console, !Catch::Contains("from rank zero"));
  CHECK_THAT(console, Catch::Contains("[default1]:from rank one\n"));
  CHECK(ddprun::test::readFile(h.runDir.path() + "/attempt_0/0/stderr.log") == "from rank zero\n");
  CHECK(std::filesystem::exists(h.runDir.path() + "/attempt_0/0/stdout.log"));
}

TEST_CASE("a signal while workers are stopped for a restart finishes without restarting", "[agent]") {
  AgentHarness h(AgentSetup{.nproc = 2, .maxRestarts = 3});
  h.start();
  h.supervisor.exitProcess(1000, 1);  // the next round is announced...
  h.pump();
  h.agent->handleSignal(SIGHUP);       // ...but the user stops the job before it starts
  h.supervisor.killProcess(1001, SIGTERM);
  h.pump();
  CHECK(h.statuses == std::vector<int>{128 + SIGHUP});
  CHECK(h.supervisor.spawned().size() == 2);
}

TEST_CASE("a repeated SIGTERM sends the workers no second signal", "[agent]") {
  AgentHarness h(AgentSetup{.nproc = 1});
  h.start();
  h.agent->handleSignal(SIGTERM);
  h.agent->handleSignal(SIGTERM);
  CHECK(h.supervisor.signalsTo(1000) == std::vector<int>{SIGTERM});
  h.supervisor.killProcess(1000, SIGTERM);
  h.pump();
  CHECK(h.statuses == std::vector<int>{143});
}

TEST_CASE("a job closed as failed without a worker failure stops the workers and finishes with the infrastructure code",
          "[agent]") {
  AgentHarness h(AgentSetup{.nproc = 2});
  h.start();
  h.agent->onJobClosed(ddprun::JobClosure{ddprun::JobOutcome::kFailed, "the rendezvous went away", {}, {}});
  CHECK(h.supervisor.signalsTo(1000) == std::vector<int>{SIGTERM});
  CHECK(h.supervisor.signalsTo(1001) == std::vector<int>{SIGTERM});
  h.supervisor.killProcess(1000, SIGTERM);
  h.supervisor.killProcess(1001, SIGTERM);
  h.pump();
  CHECK(h.statuses == std::vector<int>{ddprun::kExitInfrastructure});
}

TEST_CASE("a rendezvous that refused this node's configuration finishes with its status (2)", "[agent]") {
  AgentHarness h(AgentSetup{.nproc = 1});
  h.start();
  h.agent->onJobClosed(ddprun::JobClosure{ddprun::JobOutcome::kFailed, "refused the job token", {}, {}, 2});
  h.supervisor.killProcess(1000, SIGTERM);
  h.pump();
  CHECK(h.statuses == std::vector<int>{2});  // the message itself: test_multinode_elastic.py
}

TEST_CASE("a job ended by another node's worker failure finishes with that worker's status", "[agent]") {
  // Every node exits with the job's first failure, so that a scheduler (Slurm, a Kubernetes pod
  // failure policy) sees one exit code for the job, not the code on one node and 1 elsewhere.
  AgentHarness h(AgentSetup{.nproc = 2});
  h.start();
  h.agent->onJobClosed(ddprun::JobClosure{ddprun::JobOutcome::kFailed, "a worker on node b failed",
                                          ddprun::WorkerFailure{5, 7, 0, 7, "failed with exit code 7"}, "b"});
  CHECK(h.supervisor.signalsTo(1000) == std::vector<int>{SIGTERM});
  CHECK(h.supervisor.signalsTo(1001) == std::vector<int>{SIGTERM});
  h.supervisor.killProcess(1000, SIGTERM);
  h.supervisor.killProcess(1001, SIGTERM);
  h.pump();
  CHECK(h.statuses == std::vector<int>{7});
  CHECK_THAT(h.errText(), !Catch::Contains("FAILED"));  // nothing failed here to report
}

TEST_CASE("a node whose own worker failed second exits with the job's first failure, reporting its own", "[agent]") {
  AgentHarness h(AgentSetup{.nproc = 2, .maxRestarts = 1});
  h.start();
  h.supervisor.exitProcess(1001, 3);
  h.pump();  // reported; the rendezvous offers the next round while worker 1000 is being stopped
  // Meanwhile another node's failure had spent the budget: the job is over.
  h.agent->onJobClosed(ddprun::JobClosure{ddprun::JobOutcome::kFailed, "a worker on node b failed",
                                          ddprun::WorkerFailure{5, 7, 0, 7, "failed with exit code 7"}, "b"});
  h.supervisor.killProcess(1000, SIGTERM);
  h.pump();
  CHECK(h.statuses == std::vector<int>{7});
  CHECK(h.supervisor.spawned().size() == 2);  // the offered round never starts
  CHECK_THAT(h.errText(), Catch::Contains("exitcode  : 3"));
}

TEST_CASE("the first closure of a job is the one that counts", "[agent]") {
  AgentHarness h(AgentSetup{.nproc = 1});
  h.start();
  h.agent->onJobClosed(ddprun::JobClosure{ddprun::JobOutcome::kFailed, "first",
                                          ddprun::WorkerFailure{2, 9, 0, 9, "failed with exit code 9"}, "c"});
  h.agent->onJobClosed(ddprun::JobClosure{ddprun::JobOutcome::kFailed, "second",
                                          ddprun::WorkerFailure{3, 4, 0, 4, "failed with exit code 4"}, "d"});
  h.supervisor.killProcess(1000, SIGTERM);
  h.pump();
  CHECK(h.statuses == std::vector<int>{9});
}

TEST_CASE("fencing: the workers get a short grace, and deaths of a fenced round are not failures", "[agent][fencing]") {
  // No restart budget: a death counted as a failure would end the job with 137.
  AgentHarness h(AgentSetup{.nproc = 2, .maxRestarts = 0, .grace = 30s});
  h.start();
  REQUIRE(h.supervisor.spawned().size() == 2);
  h.fenceable.fencedThrough = 1;
  h.agent->onFenced(1, "no answer from the rendezvous for 1250ms", 250ms);
  h.pump();
  CHECK(h.supervisor.signalsTo(1000) == std::vector<int>{SIGTERM});
  CHECK(h.supervisor.signalsTo(1001) == std::vector<int>{SIGTERM});
  // The watchdog (or the kill after 250 ms, not the 30 s shutdown grace) ends them.
  h.supervisor.killProcess(1000, SIGKILL);
  h.supervisor.killProcess(1001, SIGKILL);
  h.pump();
  CHECK(h.statuses.empty());  // the node waits to join the next round; nothing was spent
  CHECK_THAT(h.errText(), !Catch::Matchers::Contains("train_prog FAILED") && !Catch::Matchers::Contains("Traceback"));
}

TEST_CASE("fencing: a worker killed while the round is fenced (the agent was frozen) is not a failure",
          "[agent][fencing]") {
  AgentHarness h(AgentSetup{.nproc = 2, .maxRestarts = 0});
  h.start();
  REQUIRE(h.supervisor.spawned().size() == 2);
  SECTION("fenced: the others are killed too, and the job goes on") {
    h.fenceable.fencedThrough = 1;
    h.supervisor.killProcess(1000, SIGKILL);
    h.pump();
    CHECK(h.supervisor.signalsTo(1001) == std::vector<int>{SIGKILL});
    h.supervisor.killProcess(1001, SIGKILL);
    h.pump();
    CHECK(h.statuses.empty());
  }
  SECTION("not fenced: the same death is the job's failure (the check above can fail)") {
    h.supervisor.killProcess(1000, SIGKILL);
    h.pump();
    h.supervisor.killProcess(1001, SIGTERM);
    h.pump();
    CHECK(h.statuses == std::vector<int>{137});
  }
}

// ---- --finish_timeout and the evidence before the kill (README "When a job hangs") --------------

TEST_CASE("finish timeout: a rank still running past the bound after one exited 0 is hung", "[agent][hang]") {
  AgentHarness h(AgentSetup{.nproc = 3, .finishTimeout = 50ms, .canDumpStack = [](pid_t pid) { return pid != 1002; }});
  h.start();
  h.supervisor.exitProcess(1001, 0);
  h.pump();
  CHECK(h.supervisor.processSignals().empty());  // not before the bound

  // Past it: the Python ranks get SIGABRT (their stack dump), nothing else yet; the other rank,
  // which cannot dump, waits with them.
  REQUIRE(h.runUntil([&] { return !h.supervisor.processSignals().empty(); }));
  CHECK(h.supervisor.processSignals().size() == 1);
  CHECK(h.supervisor.processSignals()[0].pid == 1000);
  CHECK(h.supervisor.processSignals()[0].sig == SIGABRT);
  CHECK(h.supervisor.signalsTo(1000).empty());
  CHECK(h.supervisor.signalsTo(1002).empty());

  // The dump arrived (the rank died of it): the rest of the group is stopped, the job ends 124.
  h.supervisor.killProcess(1000, SIGABRT);
  REQUIRE(h.runUntil([&] { return !h.supervisor.signalsTo(1002).empty(); }));
  CHECK(h.supervisor.signalsTo(1002) == std::vector<int>{SIGTERM});
  h.supervisor.killProcess(1002, SIGTERM);
  h.pump();
  CHECK(h.statuses == std::vector<int>{124});
  std::string summary = h.errText();
  CHECK_THAT(summary, Catch::Contains("finished: rank 1; still running: rank 0, rank 2"));
  CHECK_THAT(summary, Catch::Contains("uneven inputs"));
  CHECK_THAT(summary, Catch::Contains("exitcode  : 124 (hung: still running"));
  CHECK_THAT(summary, Catch::Contains("Stack of rank 2 (local_rank: 2): no Python stack (not a Python process)"));
}

TEST_CASE("finish timeout: a dump that does not come within the wait is skipped, and said so", "[agent][hang]") {
  AgentHarness h(AgentSetup{.nproc = 2, .finishTimeout = 20ms, .stackDumpWait = 50ms,
                            .canDumpStack = [](pid_t) { return true; }});
  h.start();
  h.supervisor.exitProcess(1001, 0);
  REQUIRE(h.runUntil([&] { return !h.supervisor.signalsTo(1000).empty(); }));
  CHECK(h.supervisor.signalsTo(1000) == std::vector<int>{SIGTERM});  // after SIGABRT went unanswered
  h.supervisor.killProcess(1000, SIGTERM);
  h.pump();
  CHECK(h.statuses == std::vector<int>{124});
  CHECK_THAT(h.errText(), Catch::Contains("no stack within 0.1s (skipped)"));
}

TEST_CASE("finish timeout: off at 0, and not counted when every rank finishes in time", "[agent][hang]") {
  AgentHarness h(AgentSetup{.nproc = 2, .finishTimeout = 200ms, .canDumpStack = [](pid_t) { return true; }});
  h.start();
  h.supervisor.exitProcess(1001, 0);
  h.pump();
  h.supervisor.exitProcess(1000, 0);
  h.pump();
  CHECK(h.statuses == std::vector<int>{0});
  CHECK(h.supervisor.processSignals().empty());
}

// ---- heartbeats (docs/heartbeat.md), through a fake source and the harness's clock ------------

TEST_CASE("every worker gets its own heartbeat channel, opened afresh for each attempt", "[agent][hang]") {
  AgentHarness h(AgentSetup{.nproc = 2, .maxRestarts = 1});
  h.start();
  CHECK(h.heartbeats->attempts == 1);
  CHECK(h.heartbeats->opened == std::vector<int>{0, 1});
  CHECK(h.heartbeats->spawnedCalls == 1);
  CHECK(h.envOf(0, "DDPRUN_HEARTBEAT_SOCKET") == "@fake-heartbeats");
  h.supervisor.exitProcess(1000, 1);
  h.pump();
  h.supervisor.killProcess(1001, SIGTERM);
  h.pump();
  REQUIRE(h.supervisor.spawned().size() == 4);
  CHECK(h.heartbeats->attempts == 2);
  CHECK(h.heartbeats->opened == std::vector<int>{0, 1});
}

TEST_CASE("heartbeat hang: a rank silent past --hang_timeout is hung, named with its step and section",
          "[agent][hang]") {
  AgentHarness h(AgentSetup{.nproc = 2, .hangTimeout = 1s});
  h.start();
  h.heartbeats->beat(0, 5);
  h.heartbeats->beat(1, 5, "checkpoint");
  h.advance(600ms);
  h.heartbeats->beat(0, 6);
  // Rank 1 has been silent 0.6 s: not hung, however long the loop runs.
  CHECK_FALSE(h.runUntil([&] { return !h.supervisor.signals().empty(); }, 400ms));
  h.advance(500ms);  // rank 1: 1.1 s; rank 0: 0.5 s
  REQUIRE(h.runUntil([&] { return h.supervisor.signalsTo(1000).size() == 1; }));
  CHECK(h.supervisor.signalsTo(1000) == std::vector<int>{SIGTERM});
  CHECK(h.supervisor.signalsTo(1001) == std::vector<int>{SIGTERM});
  h.supervisor.killProcess(1000, SIGTERM);
  h.supervisor.killProcess(1001, SIGTERM);
  h.pump();
  CHECK(h.statuses == std::vector<int>{124});
  const std::string summary = h.errText();
  CHECK_THAT(summary, Catch::Contains("rank      : 1 (local_rank: 1)"));
  CHECK_THAT(summary, Catch::Contains("no heartbeat for 1.100s after step 5, in section 'checkpoint'"));
}

TEST_CASE("heartbeat hang: a rank that finished is not watched, and beats of a stopped attempt do not count",
          "[agent][hang]") {
  AgentHarness h(AgentSetup{.nproc = 2, .hangTimeout = 1s});
  h.start();
  h.heartbeats->beat(0, 5);
  h.heartbeats->beat(1, 5);
  h.supervisor.exitProcess(1001, 0);
  h.pump();
  h.heartbeats->beat(1, 6);  // queued before it exited: it does not bring rank 1 back
  h.advance(500ms);
  h.heartbeats->beat(0, 7);
  h.advance(800ms);  // rank 1 would be silent 1.3 s; rank 0 is 0.8 s
  CHECK_FALSE(h.runUntil([&] { return !h.supervisor.signals().empty(); }, 400ms));
  h.supervisor.exitProcess(1000, 0);
  h.pump();
  CHECK(h.statuses == std::vector<int>{0});
}

TEST_CASE("stop without progress: restarts that beat no step beyond the best before end the job",
          "[agent][hang]") {
  AgentHarness h(AgentSetup{.nproc = 1, .maxRestarts = 5, .stopWithoutProgress = 1});
  h.start();
  // Attempt 0 reaches step 10 and fails: progress (nothing was reached before), a restart.
  h.heartbeats->beat(0, 10);
  h.supervisor.exitProcess(1000, 3);
  h.pump();
  REQUIRE(h.supervisor.spawned().size() == 2);
  // Attempt 1 gets past it (step 12) and fails: progress, a restart.
  h.heartbeats->beat(0, 12);
  h.supervisor.exitProcess(1001, 3);
  h.pump();
  REQUIRE(h.supervisor.spawned().size() == 3);
  // Attempt 2 fails at step 12 again: one restart without progress, which is the bound.
  h.heartbeats->beat(0, 12);
  h.supervisor.exitProcess(1002, 3);
  h.pump();
  CHECK(h.supervisor.spawned().size() == 3);
  CHECK(h.statuses == std::vector<int>{3});
  CHECK_THAT(h.errText(), Catch::Contains("1 restarts in a row made no progress (no rank beat a step beyond 12"));
}

TEST_CASE("stop without progress: ranks that never beat are not judged", "[agent][hang]") {
  AgentHarness h(AgentSetup{.nproc = 1, .maxRestarts = 2, .stopWithoutProgress = 1});
  h.start();
  for (pid_t pid = 1000; pid < 1003; ++pid) {
    h.supervisor.exitProcess(pid, 3);
    h.pump();
  }
  CHECK(h.supervisor.spawned().size() == 3);  // the whole budget
  CHECK(h.statuses == std::vector<int>{3});
}

TEST_CASE("finish timeout: a rank that beat within the bound is alive and looked at again", "[agent][hang]") {
  AgentHarness h(AgentSetup{.nproc = 2, .finishTimeout = 50ms});
  h.start();
  h.heartbeats->beat(0, 1);  // the harness's clock stands still: rank 0 stays "just beaten"
  h.supervisor.exitProcess(1001, 0);
  h.pump();
  CHECK_FALSE(h.runUntil([&] { return !h.supervisor.signals().empty(); }, 300ms));
  h.advance(60ms);  // now silent past the bound
  REQUIRE(h.runUntil([&] { return !h.supervisor.signals().empty(); }));
  CHECK(h.supervisor.signalsTo(1000) == std::vector<int>{SIGTERM});
}
