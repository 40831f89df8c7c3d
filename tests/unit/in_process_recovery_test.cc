// --recovery=in_process, the agent's side (agent/in_process_recovery.h, elastic_agent.cc) over a
// fake supervisor and heartbeat source: a failed rank is replaced while the others keep running and
// are told the next round; what makes it fall back to a restart of every rank. The real thing, with
// torch and gloo: tests/integration/test_in_process_recovery.py.
#include <signal.h>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <catch2/catch.hpp>
#include <sstream>

#include "agent/in_process_recovery.h"
#include "agent_harness.h"

namespace ddprun::test {
namespace {

constexpr auto kInProcess = AgentOptions::Recovery::kInProcess;

// What the agent logs while alive (its decisions go to spdlog, not to the workers' console).
struct LogLines {
  LogLines() : previous(spdlog::default_logger()) {
    auto logger = std::make_shared<spdlog::logger>("recovery-test", std::make_shared<spdlog::sinks::ostream_sink_mt>(out));
    logger->set_level(spdlog::level::debug);
    spdlog::set_default_logger(logger);
  }
  ~LogLines() { spdlog::set_default_logger(previous); }
  std::string text() const { return out.str(); }
  std::ostringstream out;
  std::shared_ptr<spdlog::logger> previous;
};

void optInAll(AgentHarness& h, int nproc) {
  for (int r = 0; r < nproc; ++r) h.heartbeats->beat(r, 5, {}, std::nullopt, /*recoverable=*/true);
}

bool signalled(const AgentHarness& h, pid_t pid) {
  for (const auto& s : h.supervisor.signals()) {
    if (s.pid == pid) return true;
  }
  return false;
}

// Across nodes: the rendezvous interrupts the round for another node's failure (or a lost node),
// then forms the next one, which may place this node's ranks elsewhere.
RoundInfo nextRoundAcrossNodes() {
  RoundInfo r;
  r.round = 2;
  r.groupRank = 1;
  r.groupWorldSize = 2;
  r.rankOffset = 3;
  r.worldSize = 6;
  r.restartCount = 1;
  r.masterAddr = "127.0.0.1";
  r.masterPort = 29500;
  return r;
}

TEST_CASE("in-process recovery: only the failed rank starts again, the others are told the next round", "[agent][recovery]") {
  AgentHarness h(AgentSetup{.nproc = 3, .maxRestarts = 2, .recovery = kInProcess});
  h.start();
  REQUIRE(h.supervisor.spawned().size() == 3);
  optInAll(h, 3);
  h.supervisor.exitProcess(1001, 1);  // rank 1 fails
  h.pump();
  REQUIRE(h.supervisor.spawned().size() == 4);  // its replacement, and no one else
  CHECK(h.envOf(3, "RANK") == "1");
  CHECK(h.envOf(3, "TORCHELASTIC_RESTART_COUNT") == "1");
  CHECK(h.envOf(3, "DDPRUN_ROUND") == "2");
  CHECK_FALSE(signalled(h, 1000));
  CHECK_FALSE(signalled(h, 1002));
  CHECK(h.heartbeats->reopened == std::vector<int>{1});
  REQUIRE(h.heartbeats->sent.size() == 2);
  CHECK(h.heartbeats->sent[0].first == 0);
  CHECK(h.heartbeats->sent[0].second.rfind("recover round=2 restart=1 rank=0 world=3 local_rank=0 ", 0) == 0);
  CHECK(h.heartbeats->sent[1].first == 2);
  CHECK(h.heartbeats->sent[1].second.find(" reason=rank 1 exited with 1") != std::string::npos);
  CHECK_FALSE(h.status().has_value());

  // The job then ends as any: every rank exits 0.
  for (pid_t pid : {1000, 1002, 1003}) h.supervisor.exitProcess(pid, 0);
  h.pump();
  CHECK(h.statuses == std::vector<int>{0});
}

TEST_CASE("in-process recovery: two failures in a row, each within the budget, each recovered in place", "[agent][recovery]") {
  AgentHarness h(AgentSetup{.nproc = 2, .maxRestarts = 2, .recovery = kInProcess});
  h.start();
  optInAll(h, 2);
  h.supervisor.exitProcess(1000, 1);
  h.pump();
  REQUIRE(h.supervisor.spawned().size() == 3);
  // The replacement must opt in itself before it can be recovered around, and the job must have
  // gone past the step of the first failure (the recovery completed).
  h.heartbeats->beat(0, 6, {}, std::nullopt, true);
  h.supervisor.exitProcess(1001, 1);
  h.pump();
  REQUIRE(h.supervisor.spawned().size() == 4);
  CHECK(h.envOf(3, "TORCHELASTIC_RESTART_COUNT") == "2");
  CHECK_FALSE(signalled(h, 1002));
  // A third failure is past --max_restarts=2: the job fails, the rest are stopped.
  h.heartbeats->beat(1, 7, {}, std::nullopt, true);
  h.supervisor.exitProcess(1002, 3);
  h.pump();
  CHECK(signalled(h, 1003));
  h.supervisor.exitProcess(1003, 143);
  h.pump();
  REQUIRE(h.status().has_value());
  CHECK(*h.status() == 3);
}

TEST_CASE("in-process recovery: a live rank that did not opt in makes it a restart of every rank", "[agent][recovery]") {
  LogLines log;
  AgentHarness h(AgentSetup{.nproc = 3, .maxRestarts = 1, .recovery = kInProcess});
  h.start();
  h.heartbeats->beat(0, 1, {}, std::nullopt, true);
  h.heartbeats->beat(1, 1, {}, std::nullopt, true);
  h.heartbeats->beat(2, 1);  // beats, but not under ddprun.recovery
  h.supervisor.exitProcess(1001, 1);
  h.pump();
  CHECK(signalled(h, 1000));
  CHECK(signalled(h, 1002));
  CHECK(h.heartbeats->sent.empty());
  CHECK(log.text().find("local rank 2 does not run under ddprun.recovery") != std::string::npos);
}

TEST_CASE("in-process recovery: off by default, the group restarts as always", "[agent][recovery]") {
  AgentHarness h(AgentSetup{.nproc = 2, .maxRestarts = 1});
  h.start();
  optInAll(h, 2);
  h.supervisor.exitProcess(1001, 1);
  h.pump();
  CHECK(signalled(h, 1000));
  CHECK(h.heartbeats->sent.empty());
}

TEST_CASE("in-process recovery: a second failure before the next round falls back to a restart of every rank", "[agent][recovery]") {
  LogLines log;
  AgentHarness h(AgentSetup{.nproc = 3, .maxRestarts = 3, .recovery = kInProcess});
  h.start();
  optInAll(h, 3);
  h.supervisor.exitProcess(1001, 1);
  h.supervisor.exitProcess(1002, 1);  // before the loop formed the next round
  h.pump();
  CHECK(signalled(h, 1000));  // the survivor is stopped: every rank starts again
  CHECK(h.heartbeats->sent.empty());
  h.supervisor.exitProcess(1000, 143);
  h.pump();
  CHECK(h.supervisor.spawned().size() == 6);
  CHECK(log.text().find("local rank 2 ended during the in-process recovery") != std::string::npos);
}

TEST_CASE("in-process recovery: a warm spare takes the failed rank's place, and a new spare starts behind it", "[agent][recovery]") {
  AgentHarness h(AgentSetup{.nproc = 2, .maxRestarts = 2, .recovery = kInProcess, .sparesPerNode = 1});
  h.start();
  REQUIRE(h.supervisor.spawned().size() == 3);  // two ranks and a spare
  // The spare is no rank: none of a rank's variables, DDPRUN_SPARE=1.
  const auto& spare = h.supervisor.spawned()[2].request.env;
  CHECK_FALSE(spare.get("RANK").has_value());
  CHECK_FALSE(spare.get("WORLD_SIZE").has_value());
  CHECK_FALSE(spare.get("MASTER_PORT").has_value());
  CHECK(spare.get("DDPRUN_SPARE") == std::optional<std::string>("1"));
  CHECK(spare.get("DDPRUN_RECOVERY") == std::optional<std::string>("in_process"));
  optInAll(h, 2);
  h.supervisor.exitProcess(1001, 1);
  h.pump();
  REQUIRE(h.supervisor.spawned().size() == 4);  // only the new spare: no rank was started cold
  CHECK(h.supervisor.spawned()[3].request.env.get("DDPRUN_SPARE") == std::optional<std::string>("1"));
  REQUIRE(h.heartbeats->moved.size() == 1);
  CHECK(h.heartbeats->moved[0].second == 1);
  REQUIRE(h.heartbeats->sent.size() == 2);
  bool spareTold = false;
  for (const auto& [lr, message] : h.heartbeats->sent) {
    if (lr != 1) continue;
    spareTold = true;
    CHECK(message.rfind("recover round=2 restart=1 rank=1 world=2 local_rank=1 ", 0) == 0);
    CHECK(message.find(" env.LOCAL_WORLD_SIZE=2 ") != std::string::npos);
    CHECK(message.find(" env.GROUP_RANK=0 ") != std::string::npos);
  }
  CHECK(spareTold);
  CHECK_FALSE(signalled(h, 1000));
  // The spare (pid 1002) is rank 1 now: its exit 0 and rank 0's end the job; the new spare is ended.
  h.supervisor.exitProcess(1000, 0);
  h.supervisor.exitProcess(1002, 0);
  h.pump();
  CHECK(signalled(h, 1003));
  CHECK(h.statuses == std::vector<int>{0});
}

TEST_CASE("in-process recovery: a standby node's processes wait warm until a round places its ranks", "[agent][recovery]") {
  LogLines log;
  AgentHarness h(AgentSetup{.nproc = 2, .maxRestarts = 2, .recovery = kInProcess, .sparesPerNode = 1, .holdRound = true});
  h.start();
  CHECK(h.supervisor.spawned().empty());  // not at once: a round that forms quickly starts cold ranks
  // Once it has waited a while (--spares_per_node's warm start): its two ranks' processes and a
  // spare, none of them a rank yet (none of a rank's variables, DDPRUN_SPARE=1).
  REQUIRE(h.runUntil([&] { return h.supervisor.spawned().size() == 3; }));
  for (const auto& spawned : h.supervisor.spawned()) {
    CHECK_FALSE(spawned.request.env.get("RANK").has_value());
    CHECK_FALSE(spawned.request.env.get("MASTER_PORT").has_value());
    CHECK(spawned.request.env.get("DDPRUN_SPARE") == std::optional<std::string>("1"));
  }
  CHECK(log.text().find("started 3 warm process(es) while waiting for a round") != std::string::npos);
  CHECK(h.heartbeats->sent.empty());  // no round yet: nothing to tell
  // A lost node's ranks 3-5 of 6 are this node's: the round takes the waiting processes.
  RoundInfo round = nextRoundAcrossNodes();
  h.fenceable.listener->onRoundReady(round);
  h.pump();
  CHECK(h.supervisor.spawned().size() == 3);  // nobody started cold, and the spare is still there
  CHECK(h.heartbeats->kept.size() == 3);      // the waiting processes' channels outlived the new attempt
  REQUIRE(h.heartbeats->sent.size() == 2);
  for (int lr = 0; lr < 2; ++lr) {
    CHECK(h.heartbeats->sent[lr].first == lr);
    CHECK(h.heartbeats->sent[lr].second.rfind("recover round=2 restart=1 rank=" + std::to_string(3 + lr) +
                                                  " world=6 local_rank=" + std::to_string(lr) + " ",
                                              0) == 0);
    CHECK(h.heartbeats->sent[lr].second.find(" env.GROUP_RANK=1 ") != std::string::npos);
  }
  CHECK(h.agent != nullptr);
  // Stopped before its workers end: the ranks get SIGTERM, the spare SIGKILL.
  h.agent->handleSignal(SIGTERM);
  h.pump();
  CHECK(signalled(h, 1000));
  CHECK(signalled(h, 1002));
}

TEST_CASE("in-process recovery: a node stopped while its processes wait for a round ends them all", "[agent][recovery]") {
  AgentHarness h(AgentSetup{.nproc = 2, .maxRestarts = 2, .recovery = kInProcess, .sparesPerNode = 1, .holdRound = true});
  h.start();
  REQUIRE(h.runUntil([&] { return h.supervisor.spawned().size() == 3; }));
  h.agent->handleSignal(SIGTERM);
  h.pump();
  for (pid_t pid : {1000, 1001, 1002}) CHECK(signalled(h, pid));
  CHECK(h.statuses == std::vector<int>{128 + SIGTERM});
}

TEST_CASE("in-process recovery: a failure before the last recovery completed falls back to a restart of every rank", "[agent][recovery]") {
  LogLines log;
  AgentHarness h(AgentSetup{.nproc = 3, .maxRestarts = 3, .recovery = kInProcess});
  h.start();
  optInAll(h, 3);  // step 5
  h.supervisor.exitProcess(1001, 1);
  h.pump();
  REQUIRE(h.supervisor.spawned().size() == 4);  // recovered in place: rank 1 replaced
  // The replacement opts in, the survivors beat (in their wait for the new group) but nobody gets
  // past step 5: the re-initialization fails, and the replacement exits.
  h.heartbeats->beat(1, 0, {}, std::nullopt, true);
  h.heartbeats->beat(0, 5, {}, std::nullopt, true);
  h.heartbeats->beat(2, 5, {}, std::nullopt, true);
  h.supervisor.exitProcess(1003, 1);
  h.pump();
  CHECK(signalled(h, 1000));  // not a second recovery in place: every rank restarts
  CHECK(signalled(h, 1002));
  CHECK(log.text().find("the last in-process recovery has not completed: no step past 5 since") != std::string::npos);
  for (pid_t pid : {1000, 1002}) h.supervisor.exitProcess(pid, 143);
  h.pump();
  CHECK(h.supervisor.spawned().size() == 7);  // three fresh ranks
}

TEST_CASE("in-process recovery: another node's failure, every local rank live: they keep running and are told their new place", "[agent][recovery]") {
  LogLines log;
  AgentHarness h(AgentSetup{.nproc = 3, .maxRestarts = 2, .recovery = kInProcess});
  h.start();
  optInAll(h, 3);
  REQUIRE(h.fenceable.listener != nullptr);
  h.fenceable.listener->onRoundInterrupted(1, "node n1 left: connection closed");
  h.pump();
  CHECK(h.fenceable.stoppedReports == std::vector<uint64_t>{1});  // the hand-over, answered at once
  for (pid_t pid : {1000, 1001, 1002}) CHECK_FALSE(signalled(h, pid));
  h.fenceable.listener->onRoundReady(nextRoundAcrossNodes());
  h.pump();
  CHECK(h.supervisor.spawned().size() == 3);  // nobody started
  REQUIRE(h.heartbeats->sent.size() == 3);
  for (int lr = 0; lr < 3; ++lr) {
    CHECK(h.heartbeats->sent[lr].first == lr);
    CHECK(h.heartbeats->sent[lr].second.rfind("recover round=2 restart=1 rank=" + std::to_string(3 + lr) +
                                                  " world=6 local_rank=" + std::to_string(lr) + " ",
                                              0) == 0);
    CHECK(h.heartbeats->sent[lr].second.find(" reason=node n1 left: connection closed") != std::string::npos);
  }
  CHECK(log.text().find("3 live rank(s) here told round 2 (ranks 3-5 of 6") != std::string::npos);
  CHECK_FALSE(h.status().has_value());
}

TEST_CASE("in-process recovery: another node's failure with a local rank not under the API stops this node's workers", "[agent][recovery]") {
  LogLines log;
  AgentHarness h(AgentSetup{.nproc = 2, .maxRestarts = 2, .recovery = kInProcess});
  h.start();
  h.heartbeats->beat(0, 1, {}, std::nullopt, true);
  h.heartbeats->beat(1, 1);  // not under ddprun.recovery
  h.fenceable.listener->onRoundInterrupted(1, "rank 4 on n1 failed");
  h.pump();
  CHECK(signalled(h, 1000));
  CHECK(signalled(h, 1001));
  CHECK(h.heartbeats->sent.empty());
  CHECK(log.text().find("in-process recovery is not possible here (local rank 1 does not run under ddprun.recovery)") !=
        std::string::npos);
}

TEST_CASE("in-process recovery: the notice a live worker is told", "[agent][recovery]") {
  RoundInfo round;
  round.round = 7;
  round.restartCount = 3;
  round.rankOffset = 4;
  round.worldSize = 8;
  round.masterAddr = "127.0.0.1";
  round.masterPort = 29555;
  CHECK(InProcessRecovery::notice(round, 2, "rank 5 was killed by SIGKILL") ==
        "recover round=7 restart=3 rank=6 world=8 local_rank=2 master_addr=127.0.0.1 master_port=29555 "
        "reason=rank 5 was killed by SIGKILL");
  // The round's ddprun store (libddp's workers), then a spare's contract.
  round.storeAddr = "file:///run/job/store/round_7";
  round.storePrefix = "job/7/";
  CHECK(InProcessRecovery::notice(round, 2, "x", {{"GROUP_RANK", "1"}, {"SPACED", "a b"}}) ==
        "recover round=7 restart=3 rank=6 world=8 local_rank=2 master_addr=127.0.0.1 master_port=29555 "
        "env.DDPRUN_STORE_ADDR=file:///run/job/store/round_7 env.DDPRUN_STORE_PREFIX=job/7/ env.GROUP_RANK=1 "
        "reason=x");
  const std::string hostile = InProcessRecovery::notice(round, 0, std::string(5000, '\n'));
  CHECK(hostile.size() <= 1024);
  CHECK(hostile.find('\n') == std::string::npos);
}

}  // namespace
}  // namespace ddprun::test
