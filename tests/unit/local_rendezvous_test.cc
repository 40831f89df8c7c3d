#include "rendezvous/local_rendezvous.h"

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
  std::vector<std::pair<JobOutcome, std::string>> closed;

  void onRoundReady(const RoundInfo& round) override { rounds.push_back(round); }
  void onRoundInterrupted(uint64_t round, const std::string& reason) override {
    interrupted.emplace_back(round, reason);
  }
  void onJobClosed(const ddprun::JobClosure& closure) override {
    closed.emplace_back(closure.outcome, closure.reason);
    failures.push_back(closure.failure);
  }
  std::vector<std::optional<ddprun::WorkerFailure>> failures;  // one per closed
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
  return o;
}

}  // namespace

TEST_CASE("join announces round 0 with no restarts spent, through post only", "[rendezvous]") {
  Harness h(options(4, 2));
  h.rdzv->join(&h.listener);
  CHECK(h.listener.rounds.empty());  // nothing called inside join
  CHECK(h.drain() == 1);
  REQUIRE(h.listener.rounds.size() == 1);
  const RoundInfo& r = h.listener.rounds[0];
  CHECK(r.round == 0);
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

TEST_CASE("each failure within the budget announces the next round with a fresh port", "[rendezvous]") {
  Harness h(options(2, 2));
  h.rdzv->join(&h.listener);
  h.drain();

  h.rdzv->reportWorkerFailure(0, failure());
  CHECK(h.listener.rounds.size() == 1);  // only through post
  h.drain();
  REQUIRE(h.listener.rounds.size() == 2);
  CHECK(h.listener.rounds[1].round == 1);
  CHECK(h.listener.rounds[1].restartCount == 1);
  CHECK(h.listener.rounds[1].masterPort == 40001);
  CHECK(h.listener.rounds[1].worldSize == 2);

  h.rdzv->reportWorkerFailure(1, failure());
  h.drain();
  REQUIRE(h.listener.rounds.size() == 3);
  CHECK(h.listener.rounds[2].round == 2);
  CHECK(h.listener.rounds[2].restartCount == 2);
  CHECK(h.listener.rounds[2].masterPort == 40002);
  CHECK(h.listener.closed.empty());
}

TEST_CASE("a fixed master port is kept across rounds and no port is searched", "[rendezvous]") {
  Harness h(options(2, 1, 29500));
  h.rdzv->join(&h.listener);
  h.drain();
  h.rdzv->reportWorkerFailure(0, failure());
  h.drain();
  REQUIRE(h.listener.rounds.size() == 2);
  CHECK(h.listener.rounds[0].masterPort == 29500);
  CHECK(h.listener.rounds[1].masterPort == 29500);
  CHECK(h.portQueries.empty());
}

TEST_CASE("a failure with restarts off closes the job as failed", "[rendezvous]") {
  Harness h(options(2, 0));
  h.rdzv->join(&h.listener);
  h.drain();
  h.rdzv->reportWorkerFailure(0, failure());
  CHECK(h.listener.closed.empty());  // only through post
  h.drain();
  CHECK(h.listener.rounds.size() == 1);
  REQUIRE(h.listener.closed.size() == 1);
  CHECK(h.listener.closed[0].first == JobOutcome::kFailed);
  CHECK_THAT(h.listener.closed[0].second, Catch::Contains("max_restarts"));
  // The failure that ended the job travels with it: the agent exits with its status.
  REQUIRE(h.listener.failures[0].has_value());
  CHECK(h.listener.failures[0]->rank == 1);
  CHECK(h.listener.failures[0]->exitStatus == 3);
}

TEST_CASE("a failure after the budget is spent closes the job as failed", "[rendezvous]") {
  Harness h(options(1, 2));
  h.rdzv->join(&h.listener);
  h.drain();
  h.rdzv->reportWorkerFailure(0, failure());
  h.drain();
  h.rdzv->reportWorkerFailure(1, failure());
  h.drain();
  CHECK(h.listener.closed.empty());
  h.rdzv->reportWorkerFailure(2, failure());
  h.drain();
  CHECK(h.listener.rounds.size() == 3);
  REQUIRE(h.listener.closed.size() == 1);
  CHECK(h.listener.closed[0].first == JobOutcome::kFailed);
  CHECK_THAT(h.listener.closed[0].second, Catch::Contains("2"));

  // The job is closed: nothing more happens.
  h.rdzv->reportWorkerFailure(2, failure());
  h.rdzv->reportSucceeded(2);
  CHECK(h.drain() == 0);
  CHECK(h.listener.closed.size() == 1);
}

TEST_CASE("a failure report for an old round is ignored", "[rendezvous]") {
  Harness h(options(2, 3));
  h.rdzv->join(&h.listener);
  h.drain();
  h.rdzv->reportWorkerFailure(0, failure());
  h.drain();
  REQUIRE(h.listener.rounds.size() == 2);

  h.rdzv->reportWorkerFailure(0, failure());  // a second worker of round 0 reporting late
  CHECK(h.drain() == 0);
  CHECK(h.listener.rounds.size() == 2);
  CHECK(h.listener.closed.empty());

  h.rdzv->reportWorkerFailure(7, failure());  // a round that never existed
  CHECK(h.drain() == 0);

  // The current round still counts.
  h.rdzv->reportWorkerFailure(1, failure());
  h.drain();
  REQUIRE(h.listener.rounds.size() == 3);
  CHECK(h.listener.rounds[2].restartCount == 2);
}

TEST_CASE("reportSucceeded closes the job as succeeded", "[rendezvous]") {
  Harness h(options(2, 1));
  h.rdzv->join(&h.listener);
  h.drain();
  h.rdzv->reportSucceeded(0);
  CHECK(h.listener.closed.empty());  // only through post
  h.drain();
  REQUIRE(h.listener.closed.size() == 1);
  CHECK(h.listener.closed[0].first == JobOutcome::kSucceeded);
  CHECK_FALSE(h.listener.failures[0].has_value());

  h.rdzv->reportSucceeded(0);
  h.rdzv->reportWorkerFailure(0, failure());
  CHECK(h.drain() == 0);
  CHECK(h.listener.closed.size() == 1);
  CHECK(h.listener.rounds.size() == 1);
}

TEST_CASE("reportSucceeded for an old round is ignored", "[rendezvous]") {
  Harness h(options(2, 1));
  h.rdzv->join(&h.listener);
  h.drain();
  h.rdzv->reportWorkerFailure(0, failure());
  h.drain();
  h.rdzv->reportSucceeded(0);
  CHECK(h.drain() == 0);
  CHECK(h.listener.closed.empty());
  h.rdzv->reportSucceeded(1);
  h.drain();
  REQUIRE(h.listener.closed.size() == 1);
  CHECK(h.listener.closed[0].first == JobOutcome::kSucceeded);
  CHECK_FALSE(h.listener.failures[0].has_value());
}

TEST_CASE("after leave nothing more is announced", "[rendezvous]") {
  Harness h(options(2, 3));
  h.rdzv->join(&h.listener);
  h.drain();
  h.rdzv->leave();
  h.rdzv->reportWorkerFailure(0, failure());
  h.rdzv->reportSucceeded(0);
  CHECK(h.drain() == 0);
  CHECK(h.listener.rounds.size() == 1);
  CHECK(h.listener.closed.empty());
}
