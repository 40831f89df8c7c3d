// LocalRendezvous is a driver of RendezvousState (whose rules state_machine*_test.cc cover, the
// one-node job included). These tests check the driving: callbacks only through post, the state's
// notices delivered as listener calls, a master port per round, reports the rules refuse dropped.
#include "rendezvous/client/local_rendezvous.h"

#include <catch2/catch.hpp>
#include <deque>
#include <functional>
#include <optional>
#include <vector>

using ddprun::JobOutcome;
using ddprun::LocalRendezvous;
using ddprun::LocalRendezvousOptions;
using ddprun::RoundInfo;

namespace {

struct RecordingListener : ddprun::RendezvousListener {
  std::vector<RoundInfo> rounds;
  std::vector<std::pair<uint64_t, std::string>> interrupted;
  std::vector<ddprun::JobClosure> closed;

  void onRoundReady(const RoundInfo& round) override { rounds.push_back(round); }
  void onRoundInterrupted(uint64_t round, const std::string& reason) override {
    interrupted.emplace_back(round, reason);
  }
  void onJobClosed(const ddprun::JobClosure& closure) override { closed.push_back(closure); }
};

// Rank 1 exited with code 3.
ddprun::WorkerFailure failure() { return ddprun::WorkerFailure{1, 3, 0, 3, "failed with exit code 3"}; }

// A hand-drained event loop and a port finder that hands out 40000, 40001, ...
struct Harness {
  std::deque<std::function<void()>> queue;
  std::vector<std::string> portQueries;
  int nextPort = 40000;
  RecordingListener listener;
  std::optional<LocalRendezvous> rdzv;

  explicit Harness(LocalRendezvousOptions options) {
    rdzv.emplace(
        options, [this](std::function<void()> fn) { queue.push_back(std::move(fn)); },
        [this](const std::string& host) {
          portQueries.push_back(host);
          return nextPort++;
        });
  }

  // Runs everything posted so far (and anything those post); returns how many ran.
  size_t drain() {
    size_t ran = 0;
    while (!queue.empty()) {
      auto fn = std::move(queue.front());
      queue.pop_front();
      fn();
      ++ran;
    }
    return ran;
  }
};

LocalRendezvousOptions options(int nproc, int maxRestarts, int masterPort = 0) {
  LocalRendezvousOptions o;
  o.localWorldSize = nproc;
  o.maxRestarts = maxRestarts;
  o.masterAddr = "127.0.0.1";
  o.masterPort = masterPort;
  o.nodeId = "hostA";
  return o;
}

}  // namespace

TEST_CASE("local driver: join announces the state's round 1, through post only", "[rendezvous][local]") {
  Harness h(options(4, 2));
  h.rdzv->join(&h.listener);
  CHECK(h.listener.rounds.empty());  // nothing called inside join
  CHECK(h.drain() == 1);
  REQUIRE(h.listener.rounds.size() == 1);
  const RoundInfo& r = h.listener.rounds[0];
  CHECK(r.round == 1);
  CHECK(r.restartCount == 0);
  CHECK(r.groupRank == 0);
  CHECK(r.groupWorldSize == 1);
  CHECK(r.rankOffset == 0);
  CHECK(r.worldSize == 4);
  CHECK(r.masterAddr == "127.0.0.1");
  CHECK(r.masterPort == 40000);
  CHECK(r.storeAddr.empty());
  CHECK(h.portQueries == std::vector<std::string>{"127.0.0.1"});
  CHECK(h.listener.closed.empty());
}

TEST_CASE("local driver: a failure within the budget interrupts the round and announces the next on a fresh port",
          "[rendezvous][local]") {
  Harness h(options(2, 2));
  h.rdzv->join(&h.listener);
  h.drain();

  h.rdzv->reportWorkerFailure(1, failure());
  CHECK(h.listener.rounds.size() == 1);  // only through post
  h.drain();
  REQUIRE(h.listener.interrupted.size() == 1);
  CHECK(h.listener.interrupted[0].first == 1);
  CHECK_THAT(h.listener.interrupted[0].second, Catch::Contains("node hostA failed (restart 1 of 2)"));
  REQUIRE(h.listener.rounds.size() == 2);
  CHECK(h.listener.rounds[1].round == 2);
  CHECK(h.listener.rounds[1].restartCount == 1);
  CHECK(h.listener.rounds[1].masterPort == 40001);
  CHECK(h.listener.rounds[1].worldSize == 2);
  CHECK(h.listener.closed.empty());
}

TEST_CASE("local driver: a fixed master port is kept across rounds and no port is searched", "[rendezvous][local]") {
  Harness h(options(2, 1, 29500));
  h.rdzv->join(&h.listener);
  h.drain();
  h.rdzv->reportWorkerFailure(1, failure());
  h.drain();
  REQUIRE(h.listener.rounds.size() == 2);
  CHECK(h.listener.rounds[0].masterPort == 29500);
  CHECK(h.listener.rounds[1].masterPort == 29500);
  CHECK(h.portQueries.empty());
}

TEST_CASE("local driver: the job's end carries the rules' reason, the failure and this node", "[rendezvous][local]") {
  Harness h(options(2, 0));
  h.rdzv->join(&h.listener);
  h.drain();
  h.rdzv->reportWorkerFailure(1, failure());
  CHECK(h.listener.closed.empty());  // only through post
  h.drain();
  CHECK(h.listener.rounds.size() == 1);
  REQUIRE(h.listener.closed.size() == 1);
  const auto& closure = h.listener.closed[0];
  CHECK(closure.outcome == JobOutcome::kFailed);
  CHECK_THAT(closure.reason, Catch::Contains("restarts are off (--max_restarts=0)"));
  CHECK(closure.failedNode == "hostA");
  REQUIRE(closure.failure.has_value());
  CHECK(closure.failure->rank == 1);
  CHECK(closure.failure->exitStatus == 3);

  // The job is closed: reports the rules refuse call nothing.
  h.rdzv->reportWorkerFailure(1, failure());
  h.rdzv->reportSucceeded(1);
  CHECK(h.drain() == 0);
}

TEST_CASE("local driver: success closes the job, a stale report calls nothing", "[rendezvous][local]") {
  Harness h(options(2, 1));
  h.rdzv->join(&h.listener);
  h.drain();
  h.rdzv->reportWorkerFailure(1, failure());
  h.drain();
  h.rdzv->reportSucceeded(1);  // round 1 is over
  h.rdzv->reportWorkerFailure(7, failure());  // a round that never existed
  CHECK(h.drain() == 0);
  CHECK(h.listener.closed.empty());
  h.rdzv->reportSucceeded(2);
  h.drain();
  REQUIRE(h.listener.closed.size() == 1);
  CHECK(h.listener.closed[0].outcome == JobOutcome::kSucceeded);
  CHECK_FALSE(h.listener.closed[0].failure.has_value());
}

TEST_CASE("local driver: after leave nothing more is announced", "[rendezvous][local]") {
  Harness h(options(2, 3));
  h.rdzv->join(&h.listener);
  h.drain();
  h.rdzv->leave();
  h.rdzv->reportWorkerFailure(1, failure());
  h.rdzv->reportSucceeded(1);
  CHECK(h.drain() == 0);
  CHECK(h.listener.rounds.size() == 1);
  CHECK(h.listener.closed.empty());
}
