#include "agent/worker_group.h"

#include <signal.h>

#include <boost/asio/io_context.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <optional>
#include <vector>

#include "agent/console_writer.h"
#include "fake_process_supervisor.h"
#include "safety_bound.h"
#include "test_util.h"

using ddprun::ProcessExit;
using ddprun::WorkerExit;
using ddprun::WorkerGroup;
using ddprun::WorkerGroupEvents;
using ddprun::WorkerSpec;
using ddprun::test::FakeProcessSupervisor;
using namespace std::chrono_literals;

namespace {

// Runs every ready handler, including those posted while running; returns how many ran.
size_t pump(boost::asio::io_context& io) {
  size_t total = 0;
  while (true) {
    io.restart();
    size_t ran = io.poll();
    if (ran == 0) return total;
    total += ran;
  }
}

// The console writers of a test: ddprun's fds 1 and 2 (captured by the tests that read them).
struct Consoles {
  std::shared_ptr<ddprun::ConsoleWriter> out = std::make_shared<ddprun::ConsoleWriter>(ddprun::ConsoleWriterOptions{1});
  std::shared_ptr<ddprun::ConsoleWriter> err = std::make_shared<ddprun::ConsoleWriter>(ddprun::ConsoleWriterOptions{2});
  // The writers are asynchronous: what was queued is on the fds once this returns.
  void flush() {
    REQUIRE(out->flush(std::chrono::seconds(10)));
    REQUIRE(err->flush(std::chrono::seconds(10)));
  }
};

std::vector<WorkerSpec> makeSpecs(int count, int rankOffset, const Consoles& consoles) {
  std::vector<WorkerSpec> specs;
  for (int localRank = 0; localRank < count; ++localRank) {
    WorkerSpec spec;
    spec.localRank = localRank;
    spec.rank = rankOffset + localRank;
    spec.request.executable = "/bin/true";
    spec.request.args = {"--worker", std::to_string(localRank)};
    spec.request.env.set("RANK", std::to_string(spec.rank));
    spec.output.prefix = "[test" + std::to_string(localRank) + "]:";
    spec.output.stdoutConsole = consoles.out;
    spec.output.stderrConsole = consoles.err;
    specs.push_back(std::move(spec));
  }
  return specs;
}

// A worker group over a fake supervisor, recording every event.
struct GroupHarness {
  Consoles consoles;
  boost::asio::io_context io;
  FakeProcessSupervisor supervisor;
  std::vector<WorkerExit> failures;
  int succeeded = 0;
  int stopped = 0;
  std::unique_ptr<WorkerGroup> group;

  explicit GroupHarness(int count, int rankOffset = 0, bool keepOutputFds = false) : supervisor(keepOutputFds) {
    WorkerGroupEvents events;
    events.onFirstFailure = [this](const WorkerExit& exit) { failures.push_back(exit); };
    events.onSucceeded = [this] { ++succeeded; };
    events.onStopped = [this] { ++stopped; };
    group = std::make_unique<WorkerGroup>(io, supervisor, makeSpecs(count, rankOffset, consoles), std::move(events));
    supervisor.setExitHandler([this](const ProcessExit& exit) { group->handleExit(exit); });
  }
};

}  // namespace

TEST_CASE("start spawns one process per worker with its request and output pipes", "[agent]") {
  GroupHarness h(3);
  h.group->start();
  REQUIRE(h.supervisor.spawned().size() == 3);
  for (int i = 0; i < 3; ++i) {
    const auto& spawned = h.supervisor.spawned()[i];
    CHECK(spawned.pid == 1000 + i);
    CHECK(spawned.request.executable == "/bin/true");
    CHECK(spawned.request.args == std::vector<std::string>{"--worker", std::to_string(i)});
    CHECK(spawned.request.env.get("RANK") == std::to_string(i));
    CHECK(spawned.request.stdoutFd >= 0);
    CHECK(spawned.request.stderrFd >= 0);
    CHECK(spawned.request.stdoutFd != spawned.request.stderrFd);
    CHECK(spawned.outputFdsOpen);
  }
  CHECK(h.group->pids() == std::vector<pid_t>{1000, 1001, 1002});
  CHECK_FALSE(h.group->allExited());
  CHECK(h.group->spec(2).rank == 2);
  CHECK_THROWS_AS(h.group->spec(3), ddprun::StateError);
}

TEST_CASE("the first failure is reported once, with its local rank, rank, pid and exit code", "[agent]") {
  GroupHarness h(3, 10);
  h.group->start();
  h.supervisor.exitProcess(1001, 3);
  REQUIRE(h.failures.size() == 1);
  CHECK(h.failures[0].localRank == 1);
  CHECK(h.failures[0].rank == 11);
  CHECK(h.failures[0].pid == 1001);
  CHECK(h.failures[0].exitCode == 3);
  CHECK(h.failures[0].signal == 0);
  CHECK_FALSE(h.failures[0].succeeded());

  h.supervisor.killProcess(1000, SIGSEGV);
  h.supervisor.exitProcess(1002, 0);
  pump(h.io);
  CHECK(h.failures.size() == 1);
  CHECK(h.succeeded == 0);
  CHECK(h.stopped == 0);  // nobody asked it to stop
  CHECK(h.group->allExited());
  REQUIRE(h.group->exits().size() == 3);
  CHECK(h.group->exits()[0].localRank == 1);
  CHECK(h.group->exits()[1].localRank == 0);
  CHECK(h.group->exits()[1].signal == SIGSEGV);
  CHECK(h.group->exits()[1].exitCode == -1);
  CHECK(h.group->exits()[2].localRank == 2);
  CHECK(h.group->exits()[2].succeeded());
}

TEST_CASE("a failure by signal is reported with the signal", "[agent]") {
  GroupHarness h(2);
  h.group->start();
  h.supervisor.killProcess(1000, SIGKILL);
  REQUIRE(h.failures.size() == 1);
  CHECK(h.failures[0].localRank == 0);
  CHECK(h.failures[0].signal == SIGKILL);
  CHECK(h.failures[0].exitCode == -1);
}

TEST_CASE("success is reported once, when the last worker exits 0", "[agent]") {
  GroupHarness h(3);
  h.group->start();
  h.supervisor.exitProcess(1002, 0);
  h.supervisor.exitProcess(1000, 0);
  pump(h.io);
  CHECK(h.succeeded == 0);
  h.supervisor.exitProcess(1001, 0);
  pump(h.io);
  CHECK(h.succeeded == 1);
  CHECK(h.failures.empty());
  CHECK(h.stopped == 0);
  CHECK(h.group->allExited());
  CHECK(h.supervisor.signals().empty());
}

TEST_CASE("an exit of a pid that is not a worker, or of a worker twice, is not routed", "[agent]") {
  GroupHarness h(2);
  h.group->start();
  CHECK_FALSE(h.group->handleExit(ProcessExit{999, 1, 0}));
  CHECK(h.group->handleExit(ProcessExit{1000, 0, 0}));
  CHECK_FALSE(h.group->handleExit(ProcessExit{1000, 1, 0}));
  CHECK(h.failures.empty());
  CHECK(h.group->exits().size() == 1);
}

TEST_CASE("stop signals every running worker's group, then SIGKILL after the grace", "[agent]") {
  GroupHarness h(3);
  h.group->start();
  h.supervisor.exitProcess(1001, 0);  // already gone: gets no signal
  h.group->stop(SIGTERM, 20ms);
  CHECK(h.supervisor.signalsTo(1000) == std::vector<int>{SIGTERM});
  CHECK(h.supervisor.signalsTo(1001).empty());
  CHECK(h.supervisor.signalsTo(1002) == std::vector<int>{SIGTERM});

  h.supervisor.killProcess(1000, SIGTERM);  // one obeys
  auto begin = std::chrono::steady_clock::now();
  h.io.restart();
  h.io.run_for(2s);  // returns once the kill timer has fired and nothing is left
  CHECK(std::chrono::steady_clock::now() - begin >= 20ms);
  CHECK(h.supervisor.signalsTo(1000) == std::vector<int>{SIGTERM});
  CHECK(h.supervisor.signalsTo(1002) == std::vector<int>{SIGTERM, SIGKILL});
  CHECK(h.stopped == 0);

  h.supervisor.killProcess(1002, SIGKILL);
  CHECK(h.stopped == 0);  // onStopped runs on the event loop, not inside the exit
  pump(h.io);
  CHECK(h.stopped == 1);
  CHECK(h.failures.empty());  // exits while stopping are not failures to report
  CHECK(h.succeeded == 0);
}

TEST_CASE("workers that exit within the grace get no SIGKILL", "[agent]") {
  GroupHarness h(2);
  h.group->start();
  h.group->stop(SIGINT, 20ms);
  CHECK(h.supervisor.signals().size() == 2);
  h.supervisor.killProcess(1000, SIGINT);
  h.supervisor.exitProcess(1001, 1);
  pump(h.io);
  CHECK(h.stopped == 1);
  h.io.restart();
  h.io.run_for(60ms);  // well past the grace
  CHECK(h.supervisor.signals().size() == 2);
  CHECK(h.supervisor.signalsTo(1000) == std::vector<int>{SIGINT});
  CHECK(h.supervisor.signalsTo(1001) == std::vector<int>{SIGINT});
  CHECK(h.failures.empty());
  CHECK(h.stopped == 1);
}

TEST_CASE("stop again shortens the grace and sends no second signal", "[agent]") {
  GroupHarness h(1);
  h.group->start();
  h.group->stop(SIGTERM, 600s);
  h.group->stop(SIGTERM, 20ms);
  h.io.restart();
  // Returns once the kill timer fired (nothing is left to wait for), at the latest after the
  // safety bound: SIGKILL by then means the 600 s deadline was replaced by the 20 ms one.
  h.io.run_for(ddprun::test::kSafetyBound);
  CHECK(h.supervisor.signalsTo(1000) == std::vector<int>{SIGTERM, SIGKILL});
}

TEST_CASE("stop after every worker exited reports stopped without signals", "[agent]") {
  GroupHarness h(2);
  h.group->start();
  h.supervisor.exitProcess(1000, 0);
  h.supervisor.exitProcess(1001, 0);
  h.group->stop(SIGTERM, 20ms);
  pump(h.io);
  CHECK(h.supervisor.signals().empty());
  CHECK(h.stopped == 1);
  h.group->stop(SIGTERM, 20ms);
  pump(h.io);
  CHECK(h.stopped == 1);  // once only
}

TEST_CASE("killNow sends SIGKILL to every running worker at once", "[agent]") {
  GroupHarness h(3);
  h.group->start();
  h.supervisor.exitProcess(1002, 0);
  h.group->killNow();
  CHECK(h.supervisor.signalsTo(1000) == std::vector<int>{SIGKILL});
  CHECK(h.supervisor.signalsTo(1001) == std::vector<int>{SIGKILL});
  CHECK(h.supervisor.signalsTo(1002).empty());
}

TEST_CASE("a worker that cannot be spawned fails with 127, reported on the event loop", "[agent]") {
  GroupHarness h(3);
  h.supervisor.failSpawnNumber(2);
  h.group->start();
  CHECK(h.failures.empty());  // not inside start()
  CHECK(h.supervisor.spawned().size() == 2);  // the others are started
  pump(h.io);
  REQUIRE(h.failures.size() == 1);
  CHECK(h.failures[0].localRank == 1);
  CHECK(h.failures[0].exitCode == 127);
  CHECK_THAT(h.failures[0].spawnError, Catch::Contains("fake spawn failure"));
  CHECK(h.group->pids() == std::vector<pid_t>{1000, 1001});
}

TEST_CASE("worker output reaches the console prefixed, and stderr's last lines are kept", "[agent]") {
  ddprun::test::OutputCapture err(2);
  ddprun::test::OutputCapture out(1);
  GroupHarness h(2, 0, /*keepOutputFds=*/true);
  h.group->start();
  REQUIRE(h.supervisor.writeStderr(1001, "first line\nsecond line\nunfinished"));
  REQUIRE(h.supervisor.writeStdout(1001, "to stdout\n"));
  h.supervisor.exitProcess(1001, 1);  // the exit drains what the worker left in the pipes
  REQUIRE(h.failures.size() == 1);
  CHECK(h.group->stderrTail(1) == std::vector<std::string>{"first line", "second line", "unfinished"});
  CHECK(h.group->stderrTail(0).empty());
  h.consoles.flush();
  std::string errText = err.text();
  std::string outText = out.text();
  err.restore();
  out.restore();
  CHECK_THAT(errText, Catch::Contains("[test1]:first line\n[test1]:second line\n[test1]:unfinished\n"));
  CHECK_THAT(outText, Catch::Contains("[test1]:to stdout\n"));
  CHECK_THAT(errText, !Catch::Contains("to stdout"));
}

TEST_CASE("stderr tail keeps only the last 400 lines, each cut to 2 KB", "[agent]") {
  // 400: room for a hung rank's stack dump (agent/stack_dump.h); the summary shows the last 20.
  ddprun::test::OutputCapture err(2);
  GroupHarness h(1, 0, /*keepOutputFds=*/true);
  h.group->start();
  std::string text;
  for (int i = 0; i < 430; ++i) text += "line " + std::to_string(i) + "\n";
  text += std::string(5000, 'x') + "\n";
  REQUIRE(h.supervisor.writeStderr(1000, text));
  h.supervisor.exitProcess(1000, 2);
  auto tail = h.group->stderrTail(0);
  REQUIRE(tail.size() == 400);
  CHECK(tail.front() == "line 31");
  CHECK(tail.back() == std::string(2048, 'x'));
}

TEST_CASE("warm spares started while waiting become the workers of the round, their output the ranks'", "[agent][recovery]") {
  // Before the fix, a spare that became a rank only took the rank's prefix: the rank's --log_dir
  // file stayed empty.
  ddprun::test::TempDir dir;
  ddprun::test::OutputCapture out(1);
  GroupHarness h(2, 4, /*keepOutputFds=*/true);
  WorkerGroup waiting(h.io, h.supervisor, {}, WorkerGroupEvents{});
  h.supervisor.setExitHandler([&](const ProcessExit& exit) { h.group->handleExit(exit) || waiting.handleExit(exit); });
  for (int i = 0; i < 3; ++i) {
    WorkerSpec spare = makeSpecs(1, 0, h.consoles)[0];
    spare.rank = -1;
    spare.localRank = 100 + i;
    spare.request.args = {"--spare"};
    spare.output.prefix = "[spare]:";
    REQUIRE(waiting.addSpare(std::move(spare)) == 1000 + i);
  }
  // A new group whose rank 5 writes its stdout to a file, as --log_dir makes it.
  WorkerGroupEvents events;
  events.onFirstFailure = [&](const WorkerExit& exit) { h.failures.push_back(exit); };
  auto specs = makeSpecs(2, 4, h.consoles);
  specs[1].output.stdoutFile = dir.file("rank5.stdout");
  WorkerGroup group(h.io, h.supervisor, std::move(specs), std::move(events));
  h.supervisor.setExitHandler([&](const ProcessExit& exit) { group.handleExit(exit) || waiting.handleExit(exit); });
  CHECK(group.startWithSpares(waiting) == std::vector<pid_t>{1000, 1001});
  CHECK(h.supervisor.spawned().size() == 3);  // no new process
  CHECK(waiting.spares() == 0);
  CHECK(group.spares() == 1);  // the third stays a spare, now the group's
  CHECK(group.pid(1) == 1001);
  CHECK(group.spec(1).rank == 5);
  CHECK(group.spec(1).request.args == std::vector<std::string>{"--spare"});  // what it was started with
  REQUIRE(h.supervisor.writeStdout(1001, "as rank 5\n"));
  h.supervisor.exitProcess(1001, 1);
  REQUIRE(h.failures.size() == 1);
  CHECK(h.failures[0].rank == 5);
  CHECK(h.failures[0].pid == 1001);
  h.consoles.flush();
  const std::string console = out.text();
  out.restore();
  CHECK_THAT(console, Catch::Contains("[test1]:as rank 5\n"));
  CHECK(ddprun::test::readFile(dir.file("rank5.stdout")) == "as rank 5\n");
  group.killNow();
}
