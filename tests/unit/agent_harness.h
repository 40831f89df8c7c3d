// The unit tests' ElasticAgent harness: an agent over a fake supervisor and a LocalRendezvous, on
// an io_context the test drives (elastic_agent_test.cc, agent_events_test.cc).
#pragma once

#include <signal.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <optional>

#include "agent/elastic_agent.h"
#include "fake_heartbeat_source.h"
#include "fake_process_supervisor.h"
#include "rendezvous/client/local_rendezvous.h"
#include "test_util.h"

namespace ddprun::test {

using ddprun::AgentOptions;
using ddprun::ElasticAgent;
using ddprun::LocalRendezvous;
using ddprun::LocalRendezvousOptions;
using ddprun::test::FakeProcessSupervisor;
using ddprun::test::OutputCapture;
using ddprun::test::TempDir;
using namespace std::chrono_literals;

struct AgentSetup {
  int nproc = 2;
  int maxRestarts = 0;
  int masterPort = 0;  // 0: the fake port finder hands out 50000, 50001, ...
  std::chrono::milliseconds grace = 10s;
  bool keepOutputFds = false;
  ddprun::LogOptions log = {};
  bool writeLogFiles = false;
  bool flatRunDir = false;
  bool virtualLocalRank = false;
  std::string role = "default";
  std::string localRankArg = {};
  std::size_t localRankArgAt = 0;
  std::chrono::milliseconds finishTimeout = 0ms;
  std::chrono::milliseconds hangTimeout = 0ms;
  int stopWithoutProgress = 0;
  std::chrono::milliseconds stackDumpWait = 3s;
  std::function<bool(pid_t)> canDumpStack = [](pid_t) { return false; };
  std::vector<std::shared_ptr<ddprun::AgentObserver>> observers = {};
  AgentOptions::Recovery recovery = AgentOptions::Recovery::kRestart;
  int sparesPerNode = 0;
  std::chrono::milliseconds warmStartAfter = 50ms;
  bool holdRound = false;  // the rendezvous forms no round: the test tells the agent one (a standby node)
};

// The harness's rendezvous: a LocalRendezvous that can claim a round was fenced, as the gRPC
// rendezvous does when the server stopped answering (Rendezvous::fenced).
class FenceableRendezvous final : public ddprun::Rendezvous {
 public:
  explicit FenceableRendezvous(ddprun::Rendezvous& inner) : inner_(inner) {}
  void join(ddprun::RendezvousListener* l) override {
    listener = l;
    if (!holdRound) inner_.join(l);
  }
  void reportWorkerFailure(uint64_t round, const ddprun::WorkerFailure& failure) override {
    inner_.reportWorkerFailure(round, failure);
  }
  void reportSucceeded(uint64_t round) override { inner_.reportSucceeded(round); }
  void reportStopped(uint64_t round) override {
    stoppedReports.push_back(round);
    inner_.reportStopped(round);
  }
  void leave() override {
    ++leaves;
    inner_.leave();
  }
  bool fenced(uint64_t round) const override { return round <= fencedThrough; }
  uint64_t fencedThrough = 0;
  bool holdRound = false;
  // The agent, as the rendezvous tells it: a test plays another node's rendezvous events with it.
  ddprun::RendezvousListener* listener = nullptr;
  std::vector<uint64_t> stoppedReports;
  int leaves = 0;

 private:
  ddprun::Rendezvous& inner_;
};

// An ElasticAgent over a fake supervisor and a LocalRendezvous, on an io_context the test drives.
// stderr is captured (the failure summary and worker output land there).
struct AgentHarness {
  OutputCapture err{2};
  // The agent's console writers, on the captured stderr (and the test's stdout).
  std::shared_ptr<ddprun::ConsoleWriter> consoleOut = std::make_shared<ddprun::ConsoleWriter>(ddprun::ConsoleWriterOptions{1});
  std::shared_ptr<ddprun::ConsoleWriter> consoleErr = std::make_shared<ddprun::ConsoleWriter>(ddprun::ConsoleWriterOptions{2});
  boost::asio::io_context io;
  TempDir runDir;
  FakeProcessSupervisor supervisor;
  int nextPort = 50000;
  LocalRendezvous rendezvous;
  FenceableRendezvous fenceable{rendezvous};
  std::shared_ptr<FakeHeartbeatSource> heartbeats = std::make_shared<FakeHeartbeatSource>();
  // The clock heartbeats are judged by: it moves only when the test says (advance()).
  std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now();
  std::unique_ptr<ElasticAgent> agent;
  std::vector<int> statuses;

  explicit AgentHarness(const AgentSetup& setup)
      : supervisor(setup.keepOutputFds),
        rendezvous(
            LocalRendezvousOptions{setup.nproc, setup.maxRestarts, "127.0.0.1", setup.masterPort},
            [this](std::function<void()> fn) { boost::asio::post(io, std::move(fn)); },
            [this](const std::string&) { return nextPort++; }) {
    AgentOptions o;
    o.programName = "train_prog";
    o.executable = "/bin/true";
    o.args = {"--epochs", "1"};
    o.inherited.set("PATH", "/usr/bin:/bin");
    o.inherited.set("MY_VAR", "kept");
    o.nprocPerNode = setup.nproc;
    o.maxRestarts = setup.maxRestarts;
    o.runId = "test-run-id";
    o.host = "testhost";
    o.shutdownGrace = setup.grace;
    o.runDir = runDir.path();
    o.log = setup.log;
    o.writeLogFiles = setup.writeLogFiles;
    o.flatRunDir = setup.flatRunDir;
    o.virtualLocalRank = setup.virtualLocalRank;
    o.role = setup.role;
    o.localRankArg = setup.localRankArg;
    o.localRankArgAt = setup.localRankArgAt;
    o.stdoutConsole = consoleOut;
    o.stderrConsole = consoleErr;
    o.finishTimeout = setup.finishTimeout;
    o.stackDumpWait = setup.stackDumpWait;
    o.canDumpStack = setup.canDumpStack;
    o.observers = setup.observers;
    o.hangTimeout = setup.hangTimeout;
    o.stopWithoutProgress = setup.stopWithoutProgress;
    o.heartbeats = heartbeats;
    o.recovery = setup.recovery;
    o.sparesPerNode = setup.sparesPerNode;
    o.warmStartAfter = setup.warmStartAfter;
    o.clock = [this] { return now; };
    fenceable.holdRound = setup.holdRound;
    agent = std::make_unique<ElasticAgent>(io, fenceable, supervisor, std::move(o));
  }

  ~AgentHarness() { agent.reset(); }

  // What reached the captured stderr, once the console writer has written everything queued.
  std::string errText() {
    REQUIRE(consoleErr->flush(std::chrono::seconds(10)));
    return err.text();
  }
  // Everything queued for stdout is written (for tests that capture fd 1 themselves).
  void flushStdout() { REQUIRE(consoleOut->flush(std::chrono::seconds(10))); }

  void start() {
    agent->start([this](int status) { statuses.push_back(status); });
    pump();
  }

  // Runs the loop (timers included) until `done` holds or `limit` passes (a safety bound).
  bool runUntil(const std::function<bool()>& done, std::chrono::milliseconds limit = 10s) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      io.restart();
      io.run_for(5ms);
    }
    return done();
  }

  void advance(std::chrono::milliseconds d) { now += d; }

  // Runs every ready handler, including those posted while running.
  void pump() {
    while (true) {
      io.restart();
      if (io.poll() == 0) return;
    }
  }

  std::optional<int> status() const {
    if (statuses.empty()) return std::nullopt;
    return statuses.front();
  }

  std::string envOf(size_t spawnIndex, const std::string& name) const {
    REQUIRE(spawnIndex < supervisor.spawned().size());
    auto value = supervisor.spawned()[spawnIndex].request.env.get(name);
    INFO("spawn " << spawnIndex << " variable " << name);
    REQUIRE(value.has_value());
    return *value;
  }
};

}  // namespace ddprun::test
