// Resource limits of a real RendezvousServer on loopback: the store's byte and key caps reach a
// client as CapacityError (RESOURCE_EXHAUSTED) naming the limit, and a job with no agent left is
// forgotten after the idle timeout instead of squatting its run id until its join timeout; while
// it lives, a node with other settings is told which ones differ. Harness: rendezvous_test_harness.h.
#include <catch2/catch.hpp>

#include "rendezvous_test_harness.h"

using Catch::Matchers::Contains;
using namespace ddprun::test;

TEST_CASE("limits: a job that fills its store share gets RESOURCE_EXHAUSTED, other jobs are served",
          "[limits]") {
  Watchdog dog(60s, "limits: store");
  auto options = loopbackServer();
  options.storeLimits.maxBytesPerRun = 64 * 1024;
  TestServer server(options);
  auto job = startRunningJob(server);
  ddprun::StoreClient client(ddprun::StoreClientOptions{server.address(), "", job->runId, job->round, 10s, 10s, 0ms});
  client.set("a", std::string(40 * 1024, 'x'));
  try {
    client.set("b", std::string(40 * 1024, 'x'));
    FAIL("a write past the job's store limit was accepted");
  } catch (const ddprun::CapacityError& e) {
    CHECK_THAT(e.what(), Contains("store full") && Contains("run 'job' (bytes)"));
  }
  CHECK(client.get("a").size() == 40 * 1024);  // the same client goes on
  requireUndisturbed(*job);
  requireServesNewJob(server);
}

TEST_CASE("limits: a job without agents is forgotten after the idle timeout, meanwhile a mismatch says why",
          "[limits]") {
  Watchdog dog(60s, "limits: idle job");
  auto options = loopbackServer();
  options.jobIdleTimeout = 1500ms;
  TestServer server(options);
  {
    Session s(server.address());
    REQUIRE(s.send(joinMessage("squat", "node-a", jobRules(2, 2), 1)));  // waits for a second node
    CHECK_FALSE(s.next(200ms).has_value());
    s.cancel();
    CHECK(s.waitClosed(kReply));
  }
  // Within the idle time the job is still there: a node with other settings learns what differs.
  auto refused = rejectedJoin(server, joinMessage("squat", "node-b", jobRules(1, 4, 3), 1), pb::Rejected::RULES_MISMATCH);
  CHECK_THAT(refused.message(), Contains("nnodes 1..4 here, 2..2 in the job"));
  CHECK_THAT(refused.message(), Contains("max_restarts 3 here, 1 in the job"));
  CHECK_THAT(refused.message(), Contains("no agent for"));
  // After it (the join timeout is 60 s), the run id is free for a job with other settings.
  std::this_thread::sleep_for(2500ms);
  Session fresh(server.address());
  REQUIRE(fresh.send(joinMessage("squat", "node-b", jobRules(1, 1), 1)));
  CHECK(expectAssigned(fresh).round() == 1);
}

// bench/RESULTS_MULTINODE.md, finding 1: every Join woke the deadline thread, which walks every
// node of every job under the service mutex, so a gathering of N nodes cost O(N^2). A plain Join
// (a new node in a job that has nodes) cannot bring a deadline earlier than the thread's next
// one, so it must not wake it. Counted, not timed: the old code woke it about once per Join.
TEST_CASE("limits: joins into a gathering job do not wake the deadline thread each", "[limits][scale]") {
  Watchdog dog(60s, "limits: join wake-ups");
  TestServer server;
  constexpr int kNodes = 60;
  const auto rules = jobRules(kNodes + 1, kNodes + 1);  // never complete: no round forms meanwhile
  std::vector<std::unique_ptr<Session>> sessions;
  sessions.push_back(std::make_unique<Session>(server.address()));
  REQUIRE(sessions.back()->send(joinMessage("wake", "node-0", rules, 1)));
  std::this_thread::sleep_for(200ms);  // the first Join (a new job) wakes it; let that settle
  const uint64_t before = server.server.timerWakeups();
  for (int i = 1; i < kNodes; ++i) {
    sessions.push_back(std::make_unique<Session>(server.address()));
    REQUIRE(sessions.back()->send(joinMessage("wake", "node-" + std::to_string(i), rules, 1)));
    std::this_thread::sleep_for(3ms);  // one Join at a time: the old code's wake-ups do not merge
  }
  std::this_thread::sleep_for(300ms);
  const uint64_t wakeups = server.server.timerWakeups() - before;
  INFO(wakeups << " wake-ups for " << kNodes - 1 << " Joins");
  CHECK(wakeups < 5);
  for (auto& s : sessions) s->cancel();
}
