// Every way a job or round ends, with store waits pending on several keys from several clients:
// the server must neither deadlock nor leave the waits hanging, must serve a new job afterwards,
// and must shut down promptly. Regression test for the deadlock where the timer thread, holding
// the rendezvous lock, dropped a finished job's store keys and a pending wait's failure callback
// asked the rendezvous (the same lock) whether its round was current.
// Harness: rendezvous_test_harness.h (a watchdog ends the executable if the server hangs).
#include <catch2/catch.hpp>

#include "rendezvous_test_harness.h"

using Catch::Matchers::Contains;
using namespace ddprun::test;

namespace {

// Safety bound for a pending wait to end once its round is over (generous: two shared cores).
constexpr milliseconds kWaitEnds = 10s;

// `clients` store clients of (runId, round), each waiting on `keys` keys that nobody sets, with a
// deadline far beyond the test's, so only the round's end can end them.
class PendingWaits {
 public:
  PendingWaits(const std::string& address, const std::string& runId, uint64_t round, int clients = 3, int keys = 4) {
    for (int c = 0; c < clients; ++c) {
      threads_.emplace_back([=, this] {
        std::vector<std::string> names;
        for (int k = 0; k < keys; ++k) names.push_back("never-set-" + std::to_string(c) + "-" + std::to_string(k));
        std::string outcome;
        try {
          ddprun::StoreClient client(ddprun::StoreClientOptions{address, "", runId, round, 120s, 10s, 0ms});
          {
            std::lock_guard<std::mutex> lock(mu_);
            ++connected_;
          }
          cv_.notify_all();
          client.wait(names);
          outcome = "satisfied";
        } catch (const std::exception& e) {
          outcome = e.what();
        }
        std::lock_guard<std::mutex> lock(mu_);
        outcomes_.push_back(outcome);
        cv_.notify_all();
      });
    }
    std::unique_lock<std::mutex> lock(mu_);
    REQUIRE(cv_.wait_for(lock, kReply, [&] { return connected_ == clients; }));
    // The waits are on their way; give the server time to register them. None may end by itself.
    REQUIRE_FALSE(cv_.wait_for(lock, 300ms, [&] { return !outcomes_.empty(); }));
  }
  ~PendingWaits() {
    for (auto& t : threads_) t.join();
  }

  // Every wait ended within `timeout`; returns how they ended.
  std::vector<std::string> requireEnded(milliseconds timeout = kWaitEnds) {
    std::unique_lock<std::mutex> lock(mu_);
    bool all = cv_.wait_for(lock, timeout, [&] { return outcomes_.size() == threads_.size(); });
    INFO("waits ended: " << outcomes_.size() << " of " << threads_.size());
    REQUIRE(all);
    for (const auto& o : outcomes_) CHECK(o != "satisfied");
    return outcomes_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int connected_ = 0;
  std::vector<std::string> outcomes_;
  std::vector<std::thread> threads_;
};

pb::AgentMessage leaveMessage() {
  pb::AgentMessage msg;
  msg.mutable_leave()->set_reason("test");
  return msg;
}

pb::JobRules rulesWith(int minNodes, int maxNodes, int maxRestarts, uint32_t joinMs, uint32_t heartbeatMs) {
  pb::JobRules r = jobRules(minNodes, maxNodes, maxRestarts, /*lastCallMs=*/50);
  r.set_join_timeout_ms(joinMs);
  r.set_heartbeat_timeout_ms(heartbeatMs);
  return r;
}

struct TwoNodeJob {
  std::unique_ptr<Session> a, b;
  uint64_t round = 0;
};

TwoNodeJob startJob(const TestServer& server, const std::string& runId, const pb::JobRules& rules) {
  TwoNodeJob job;
  job.a = std::make_unique<Session>(server.address());
  job.b = std::make_unique<Session>(server.address());
  REQUIRE(job.a->send(joinMessage(runId, "node-a", rules, 1, 29501)));
  REQUIRE(job.b->send(joinMessage(runId, "node-b", rules, 1, 29502)));
  job.round = expectAssigned(*job.a).round();
  REQUIRE(expectAssigned(*job.b).round() == job.round);
  return job;
}

// After the ending under test: a new job is served, and shutdown is prompt.
void requireHealthyAfter(TestServer& server) {
  requireServesNewJob(server);
  CHECK(server.stop() < 5s);
}

}  // namespace

TEST_CASE("teardown: the job succeeds while waits are pending", "[teardown]") {
  Watchdog dog(60s, "teardown: success");
  TestServer server;
  auto job = startJob(server, "ok", rulesWith(2, 2, 0, 60000, 60000));
  PendingWaits waits(server.address(), "ok", job.round);
  REQUIRE(job.a->send(succeeded(job.round)));
  REQUIRE(job.b->send(succeeded(job.round)));
  CHECK(expectMessage(*job.a).has_job_closed());
  CHECK(expectMessage(*job.b).has_job_closed());
  for (const auto& o : waits.requireEnded()) CHECK_THAT(o, Contains("round"));
  requireHealthyAfter(server);
}

TEST_CASE("teardown: a worker failure with no restarts left ends the job while waits are pending", "[teardown]") {
  Watchdog dog(60s, "teardown: failure, budget spent");
  TestServer server;
  auto job = startJob(server, "fail", rulesWith(2, 2, 0, 60000, 60000));
  PendingWaits waits(server.address(), "fail", job.round);
  REQUIRE(job.b->send(workerFailed(job.round)));
  CHECK(expectMessage(*job.a).has_job_closed());
  CHECK(expectMessage(*job.b).has_job_closed());
  // The agents go away as real ones do once their job closed.
  job.a.reset();
  job.b.reset();
  waits.requireEnded();
  requireHealthyAfter(server);
}

TEST_CASE("teardown: a restart after a worker failure ends the old round's waits", "[teardown]") {
  Watchdog dog(60s, "teardown: restart");
  TestServer server;
  auto job = startJob(server, "restart", rulesWith(2, 2, 1, 60000, 60000));
  PendingWaits waits(server.address(), "restart", job.round);
  REQUIRE(job.a->send(workerFailed(job.round)));
  expectInterrupted(*job.a);
  expectInterrupted(*job.b);
  CHECK(expectAssigned(*job.a).round() == job.round + 1);
  CHECK(expectAssigned(*job.b).round() == job.round + 1);
  for (const auto& o : waits.requireEnded()) CHECK_THAT(o, Contains("round"));
  requireHealthyAfter(server);
}

TEST_CASE("teardown: a node that leaves ends the round's waits, the survivor runs on", "[teardown]") {
  Watchdog dog(60s, "teardown: leave");
  TestServer server;
  auto job = startJob(server, "leave", rulesWith(1, 2, 0, 60000, 60000));
  PendingWaits waits(server.address(), "leave", job.round);
  REQUIRE(job.b->send(leaveMessage()));
  expectInterrupted(*job.a);
  CHECK(expectAssigned(*job.a).round() == job.round + 1);
  waits.requireEnded();
  requireHealthyAfter(server);
}

TEST_CASE("teardown: the join timeout closes a job below min while waits are pending", "[teardown]") {
  Watchdog dog(60s, "teardown: join timeout");
  TestServer server;
  auto job = startJob(server, "below-min", rulesWith(2, 2, 0, /*joinMs=*/1000, 60000));
  PendingWaits waits(server.address(), "below-min", job.round);
  job.b->cancel();  // node-b dies: node-a waits for a second node until the join timeout
  expectInterrupted(*job.a);
  auto closed = expectMessage(*job.a, 10s);
  INFO("got " << closed.ShortDebugString());
  CHECK(closed.has_job_closed());
  job.a.reset();
  waits.requireEnded();
  requireHealthyAfter(server);
}

TEST_CASE("teardown: a node that misses its heartbeats ends the round's waits", "[teardown]") {
  Watchdog dog(60s, "teardown: lost heartbeat");
  TestServer server;
  auto job = startJob(server, "silent", rulesWith(1, 2, 0, 60000, /*heartbeatMs=*/1000));
  PendingWaits waits(server.address(), "silent", job.round);
  // node-a heartbeats; node-b stays silent until the server drops it and restarts node-a alone.
  std::optional<pb::ServerMessage> msg;
  for (int i = 0; i < 100 && !msg; ++i) {
    REQUIRE(job.a->send(heartbeat(job.round)));
    msg = job.a->next(100ms);
  }
  REQUIRE(msg.has_value());
  CHECK(msg->has_round_interrupted());
  CHECK(expectAssigned(*job.a).round() == job.round + 1);
  waits.requireEnded();
  REQUIRE(job.a->send(succeeded(job.round + 1)));
  CHECK(expectMessage(*job.a).has_job_closed());
  requireHealthyAfter(server);
}

TEST_CASE("teardown: shutdown with a job running and waits pending", "[teardown]") {
  Watchdog dog(60s, "teardown: shutdown");
  TestServer server;
  auto job = startJob(server, "running", rulesWith(2, 2, 0, 60000, 60000));
  PendingWaits waits(server.address(), "running", job.round);
  CHECK(server.stop() < 5s);
  waits.requireEnded();
  CHECK(job.a->waitClosed(kReply));
  CHECK(job.b->waitClosed(kReply));
}
