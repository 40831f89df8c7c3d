// Hang evidence (agent/hang_evidence.h) on a worker group over the fake supervisor: which ranks
// are asked for a stack and why the others have none, how long a dump is awaited, what is said
// when none came.
#include "agent/hang_evidence.h"

#include <signal.h>

#include <boost/asio/io_context.hpp>
#include <catch2/catch.hpp>

#include "fake_process_supervisor.h"

using ddprun::Attempt;
using ddprun::RoundInfo;
using ddprun::WorkerExit;
using ddprun::WorkerGroup;
using ddprun::WorkerSpec;
using ddprun::test::FakeProcessSupervisor;
using namespace std::chrono_literals;

namespace {

struct Group {
  boost::asio::io_context io;
  FakeProcessSupervisor supervisor;
  std::unique_ptr<WorkerGroup> group;
  Attempt attempt{RoundInfo{}, 0ms};

  explicit Group(int count) {
    attempt.round.rankOffset = 10;
    std::vector<WorkerSpec> specs;
    for (int localRank = 0; localRank < count; ++localRank) {
      WorkerSpec spec;
      spec.localRank = localRank;
      spec.rank = 10 + localRank;
      spec.request.executable = "/bin/true";
      spec.flightRecorder = "/nonexistent/flight_recorder";  // not an SDK program
      specs.push_back(std::move(spec));
    }
    group = std::make_unique<WorkerGroup>(io, supervisor, std::move(specs), ddprun::WorkerGroupEvents{});
    supervisor.setExitHandler([this](const ddprun::ProcessExit& exit) { group->handleExit(exit); });
    group->start();
  }
};

}  // namespace

TEST_CASE("hang evidence: Python ranks are asked for a stack, the others say why they have none", "[agent][hang]") {
  Group g(3);
  const auto now = std::chrono::steady_clock::now();
  g.supervisor.exitProcess(1002, 0);  // finished: not asked
  g.io.restart();
  g.io.poll();
  ddprun::requestStackDumps(*g.group, g.attempt, 3, [](pid_t pid) { return pid == 1000; }, now + 3s);
  REQUIRE(g.supervisor.processSignals().size() == 1);
  CHECK(g.supervisor.processSignals()[0].pid == 1000);
  CHECK(g.supervisor.processSignals()[0].sig == SIGABRT);
  REQUIRE(g.attempt.stacks.size() == 2);
  CHECK(g.attempt.stacks[1].rank == 11);
  CHECK(g.attempt.stacks[1].missing == "no Python stack (not a Python process)");
  CHECK(g.attempt.dumping == std::set<int>{0});

  CHECK(ddprun::stackDumpsPending(*g.group, g.attempt, now));       // rank 0 still runs
  CHECK_FALSE(ddprun::stackDumpsPending(*g.group, g.attempt, now + 3s));  // the wait is over
  ddprun::collectStackDumps(*g.group, g.attempt, 3s);
  CHECK(g.attempt.stacks[0].missing == "no stack within 3.0s (skipped)");
  CHECK(g.attempt.dumping.empty());
}

TEST_CASE("hang evidence: without flight recorders the blamed rank stands", "[agent][hang]") {
  Group g(2);
  WorkerExit exit;
  exit.rank = 11;
  exit.localRank = 1;
  exit.hangNote = "no heartbeat";
  const WorkerExit blamed = ddprun::blameFromFlightRecorders(*g.group, g.attempt, 2, exit);
  CHECK(blamed.rank == 11);
  CHECK(blamed.hangNote == "no heartbeat");
  CHECK_FALSE(g.attempt.recorderAttributed);
  CHECK(g.attempt.diagnosis.empty());
}
