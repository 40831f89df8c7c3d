// The server's half of fencing (docs/rendezvous.md, "Fencing"), with a real server and real
// sessions: every heartbeat is answered with its sequence number; a node silent past the heartbeat
// timeout is told EVICTED (it was declared dead and may join again) before the others move on;
// the evicted node joins again with the same id as a newcomer; the store refuses the old round.
// Regression test: before, a silent node was dropped without a word and its next heartbeat got a
// fatal NOT_JOINED, which made the agent exit instead of joining again.
#include <catch2/catch.hpp>

#include <set>

#include "rendezvous_test_harness.h"

using Catch::Matchers::Contains;
using namespace ddprun::test;

namespace {

pb::AgentMessage heartbeatWithSeq(uint64_t round, uint64_t seq) {
  pb::AgentMessage msg = heartbeat(round);
  msg.mutable_heartbeat()->set_seq(seq);
  return msg;
}

}  // namespace

TEST_CASE("fencing: heartbeats are answered with their sequence number", "[rendezvous][fencing]") {
  Watchdog watchdog(60s, "fencing");
  TestServer server;
  Session a(server.address());
  REQUIRE(a.send(joinMessage("fence-acks", "node-a", jobRules(1, 1, 0, 0), 1)));
  auto assigned = expectAssigned(a);
  CHECK(assigned.acks_heartbeats());
  for (uint64_t seq = 1; seq <= 5; ++seq) REQUIRE(a.send(heartbeatWithSeq(assigned.round(), seq)));
  REQUIRE(a.waitAcks(1));
  // Answers may be coalesced (a newer one replaces a queued one), never lost: the last one comes.
  auto deadline = Clock::now() + kReply;
  while (Clock::now() < deadline && a.transcript().find("heartbeat_ack { seq: 5 }") == std::string::npos) {
    std::this_thread::sleep_for(10ms);
  }
  CHECK_THAT(a.transcript(), Contains("heartbeat_ack { seq: 5 }"));
  CHECK_FALSE(a.next(200ms).has_value());  // nothing else: answers are not round changes
}

TEST_CASE("fencing: a silent node is told it was declared dead and may join again", "[rendezvous][fencing]") {
  Watchdog watchdog(60s, "fencing");
  LogCapture log;
  TestServer server;
  auto rules = jobRules(1, 2, 0, 0);
  rules.set_heartbeat_timeout_ms(600);
  Session a(server.address());
  Session b(server.address());
  REQUIRE(a.send(joinMessage("fence-evict", "node-a", rules, 1)));
  REQUIRE(b.send(joinMessage("fence-evict", "node-b", rules, 1, 29501)));
  // min 1, max 2, no last call: a may be assigned alone first, then b's join interrupts.
  uint64_t round = 0;
  auto deadline = Clock::now() + kReply;
  std::set<std::string> inRound;
  while (Clock::now() < deadline && inRound.size() < 2) {
    for (Session* s : {&a, &b}) {
      if (auto msg = s->next(20ms); msg && msg->has_round_assigned() && msg->round_assigned().round() >= round) {
        if (msg->round_assigned().round() > round) inRound.clear();
        round = msg->round_assigned().round();
        inRound.insert(s == &a ? "a" : "b");
      }
    }
  }
  REQUIRE(inRound.size() == 2);

  // a keeps beating, b goes silent (a frozen agent): b is told EVICTED, a is interrupted.
  auto until = Clock::now() + 1500ms;
  uint64_t seq = 0;
  while (Clock::now() < until && b.isOpen()) {
    REQUIRE(a.send(heartbeatWithSeq(round, ++seq)));
    std::this_thread::sleep_for(75ms);
  }
  auto evicted = expectRejected(b, pb::Rejected::EVICTED, true);
  CHECK_THAT(evicted.message(), Contains("declared dead"));
  // The daemon's log says why it is gone, not "connection closed" (its stream closes after).
  auto logDeadline = Clock::now() + kReply;
  while (Clock::now() < logDeadline && log.text().find("node node-b is gone") == std::string::npos) {
    std::this_thread::sleep_for(10ms);
  }
  CHECK_THAT(log.text(), Contains("node node-b is gone (declared dead: no heartbeat for"));
  CHECK(expectInterrupted(a).round() == round);
  // The old round is over for the store too: a worker of it is refused.
  grpc::Status stale = storeCheck(server.address(), std::nullopt, "fence-evict", round);
  INFO("store check of the old round: " << statusText(stale));
  CHECK_FALSE(stale.ok());

  // b comes back (SIGCONT): a new session with the same node id and its last round is a newcomer.
  Session b2(server.address());
  auto rejoin = joinMessage("fence-evict", "node-b", rules, 1, 29501);
  rejoin.mutable_join()->set_last_round(round);
  rejoin.mutable_join()->set_has_last_round(true);
  REQUIRE(b2.send(rejoin));
  REQUIRE(a.send(heartbeatWithSeq(round, ++seq)));
  auto reassigned = expectAssigned(b2);
  CHECK(reassigned.round() > round);
  CHECK(reassigned.restart_count() == 0);  // a membership change, not a restart
}

TEST_CASE("a job whose first Join was refused is forgotten, and the log says why, not a time since 0",
          "[rendezvous][fencing]") {
  Watchdog watchdog(60s, "fencing");
  LogCapture log;
  TestServer server;
  Session a(server.address());
  auto join = joinMessage("never-had-round-7", "node-a", jobRules(1, 1, 0, 0), 1);
  join.mutable_join()->set_last_round(7);  // a restarted server never had it: STALE_ROUND
  join.mutable_join()->set_has_last_round(true);
  REQUIRE(a.send(join));
  expectRejected(a, pb::Rejected::STALE_ROUND, true);
  auto deadline = Clock::now() + kReply;
  while (Clock::now() < deadline && log.text().find("job 'never-had-round-7': forgotten") == std::string::npos) {
    std::this_thread::sleep_for(10ms);
  }
  CHECK_THAT(log.text(), Contains("job 'never-had-round-7': forgotten (its first Join was refused"));
  CHECK_THAT(log.text(), !Contains("without an agent"));
}
