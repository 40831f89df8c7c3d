// Unit tests of the rendezvous state machine (rendezvous/rules/state_machine.h): every rule of DESIGN.md
// "Rendezvous", driven by a fake clock in microseconds. Notices are rendered to one line each so a
// test can state exactly who gets what (round, ranks, offsets, world size, restart count, master)
// and Catch prints the whole batch when it differs.
#include <catch2/catch.hpp>

#include "state_machine_test_util.h"

using namespace ddprun::state_machine_test;

// ---- 1. min=max=N ---------------------------------------------------------------------------------

TEST_CASE("min=max=N: the round closes exactly when the Nth node joins", "[rendezvous]") {
  RendezvousState s("job", rules(3, 3), sec(0));
  CHECK(s.phase() == Phase::kGathering);
  CHECK(s.round() == 0);

  CHECK(join(s, "a", sec(1), 2).empty());
  CHECK(join(s, "b", sec(2), 3).empty());
  CHECK(s.phase() == Phase::kGathering);
  CHECK(s.round() == 0);
  CHECK(s.members().empty());

  auto out = join(s, "c", sec(3), 1);
  CHECK(render(out) == Lines{
                           assigned("a", 1, 0, 3, 0, 6, 0, "a"),
                           assigned("b", 1, 1, 3, 2, 6, 0, "a"),
                           assigned("c", 1, 2, 3, 5, 6, 0, "a"),
                       });
  auto toC = bodiesFor<RoundAssignment>(out, "c");
  REQUIRE(toC.size() == 1);
  CHECK(toC[0].masterAddr == "host-a");
  CHECK(toC[0].masterPort == portOf("a"));
  CHECK(s.phase() == Phase::kRunning);
  CHECK(s.round() == 1);
  CHECK(s.restartCount() == 0);
  CHECK(s.members() == Lines{"a", "b", "c"});
  CHECK(s.isCurrentRound(1));
  CHECK_FALSE(s.isCurrentRound(0));
}

// ---- 2. MIN:MAX -----------------------------------------------------------------------------------

TEST_CASE("min:max: last call after min joined, or at once when max joined", "[rendezvous]") {
  auto r = rules(2, 4);
  r.heartbeatTimeout = sec(120);  // beyond the last call, so nextDeadline() is the last call
  RendezvousState s("job", r, sec(0));

  CHECK(join(s, "a", sec(1)).empty());
  CHECK(join(s, "b", sec(2)).empty());
  CHECK(s.phase() == Phase::kGathering);
  CHECK(s.round() == 0);
  CHECK(s.nextDeadline() == sec(2) + r.lastCallTimeout);

  SECTION("the last call expires with two nodes") {
    CHECK(s.tick(sec(32) - kUs).empty());
    CHECK(s.phase() == Phase::kGathering);
    auto out = s.tick(sec(32));
    CHECK(render(out) == Lines{
                             assigned("a", 1, 0, 2, 0, 2, 0, "a"),
                             assigned("b", 1, 1, 2, 1, 2, 0, "a"),
                         });
    CHECK(s.phase() == Phase::kRunning);
    CHECK(s.round() == 1);
  }

  SECTION("the fourth join inside the last call closes the round at once") {
    CHECK(join(s, "c", sec(10)).empty());
    CHECK(s.nextDeadline() == sec(32));  // a third join does not extend the last call
    CHECK(s.phase() == Phase::kGathering);
    auto out = join(s, "d", sec(20));
    CHECK(render(out) == Lines{
                             assigned("a", 1, 0, 4, 0, 4, 0, "a"),
                             assigned("b", 1, 1, 4, 1, 4, 0, "a"),
                             assigned("c", 1, 2, 4, 2, 4, 0, "a"),
                             assigned("d", 1, 3, 4, 3, 4, 0, "a"),
                         });
    CHECK(s.phase() == Phase::kRunning);
    CHECK(s.round() == 1);
    CHECK(s.tick(sec(32)).empty());  // the old last call has no effect any more
    CHECK(s.round() == 1);
  }
}

// ---- 3. join_timeout ------------------------------------------------------------------------------

TEST_CASE("join_timeout: fewer than min nodes until the deadline closes the job", "[rendezvous]") {
  auto r = rules(3, 3);
  r.joinTimeout = sec(60);
  RendezvousState s("job", r, sec(0));
  CHECK(join(s, "a", sec(1)).empty());
  CHECK(join(s, "b", sec(2)).empty());

  CHECK(keepAlive(s, {"a", "b"}, sec(3), sec(59)).empty());
  CHECK(s.tick(sec(60) - kUs).empty());
  CHECK(s.phase() == Phase::kGathering);

  auto out = s.tick(sec(60));
  CHECK(render(out) == Lines{ended("a", false), ended("b", false)});
  CHECK_THAT(textFor(out, "a"), Contains("join timeout"));
  CHECK_THAT(textFor(out, "b"), Contains("join timeout"));
  CHECK(s.phase() == Phase::kClosed);
  CHECK(s.round() == 0);

  auto late = join(s, "c", sec(61));
  CHECK(render(late) == Lines{rejected("c", RejectCode::kJobClosed, true)});
  CHECK_FALSE(s.hasNode("c"));
  CHECK(s.phase() == Phase::kClosed);
}

// ---- 4. dead nodes --------------------------------------------------------------------------------

namespace {

// min=2, max=3; a (2 workers), b (3), c (1) form round 1; b (group rank 1) stops heartbeating.
std::vector<Notice> killMiddleNode(RendezvousState& s) {
  std::vector<Notice> all;
  append(all, join(s, "a", sec(1), 2));
  append(all, join(s, "b", sec(1), 3));
  append(all, join(s, "c", sec(1), 1));
  append(all, keepAlive(s, {"a", "c"}, sec(2), sec(6)));  // b last seen at 1s: alive up to 6s
  append(all, s.tick(sec(6) + kUs));
  return all;
}

}  // namespace

TEST_CASE("dead node: missed heartbeats restart the survivors at once, keeping their ranks", "[rendezvous]") {
  RendezvousState s("job", rules(2, 3), sec(0));
  auto all = killMiddleNode(s);
  REQUIRE(all.size() == 3 + 1 + 2 + 2);  // round 1, b told it is out, the interruption, round 2
  Lines lines = render(all);
  Lines round1(lines.begin(), lines.begin() + 3);
  CHECK(round1 == Lines{
                      assigned("a", 1, 0, 3, 0, 6, 0, "a"),
                      assigned("b", 1, 1, 3, 2, 6, 0, "a"),
                      assigned("c", 1, 2, 3, 5, 6, 0, "a"),
                  });
  std::vector<Notice> death(all.begin() + 3, all.end());
  // Rank 0 stays 0; rank 2 takes the hole at 1 (it cannot keep 2 in a round of 2).
  CHECK(render(death) == Lines{
                             rejected("b", RejectCode::kEvicted, true),
                             interrupted("a", 1),
                             interrupted("c", 1),
                             assigned("a", 2, 0, 2, 0, 3, 0, "a"),
                             assigned("c", 2, 1, 2, 2, 3, 0, "a"),
                         });
  CHECK_THAT(textFor(death, "a"), Contains("node b"));
  CHECK_THAT(textFor(death, "c"), Contains("node b"));
  CHECK_FALSE(s.hasNode("b"));
  CHECK(s.phase() == Phase::kRunning);
  CHECK(s.round() == 2);
  CHECK(s.restartCount() == 0);
  CHECK(s.members() == Lines{"a", "c"});

  // The same events give the same notices, reasons included.
  RendezvousState replay("job", rules(2, 3), sec(0));
  CHECK(render(killMiddleNode(replay), true) == render(all, true));
}

TEST_CASE("dead node: a membership change keeps the restart count already spent", "[rendezvous]") {
  RendezvousState s("job", rules(2, 3, 5), sec(0));
  startRound(s, {"a", "b", "c"});
  auto failed = s.workerFailed("c", 1, sec(2));
  CHECK(bodiesFor<RoundAssignment>(failed, "a").at(0).restartCount == 1);
  CHECK(s.round() == 2);

  auto out = s.leave("b", "stream closed", sec(3));
  CHECK(render(out) == Lines{
                           interrupted("a", 2),
                           interrupted("c", 2),
                           assigned("a", 3, 0, 2, 0, 2, 1, "a"),
                           assigned("c", 3, 1, 2, 1, 2, 1, "a"),
                       });
  CHECK(s.restartCount() == 1);
}

TEST_CASE("dead node: heartbeats keep a node alive", "[rendezvous]") {
  RendezvousState s("job", rules(2, 2), sec(0));
  startRound(s, {"a", "b"});
  CHECK(keepAlive(s, {"a", "b"}, sec(2), sec(300)).empty());
  CHECK(s.phase() == Phase::kRunning);
  CHECK(s.round() == 1);
  CHECK(s.members() == Lines{"a", "b"});
  // b stops: exactly heartbeatTimeout after its last heartbeat it is still alive, 1us later not.
  CHECK(s.heartbeat("a", sec(305)).empty());
  CHECK(s.tick(sec(305)).empty());
  CHECK(s.hasNode("b"));
  auto out = s.tick(sec(305) + kUs);
  CHECK(render(out) == Lines{rejected("b", RejectCode::kEvicted, true), interrupted("a", 1)});
  CHECK_FALSE(s.hasNode("b"));
}

TEST_CASE("dead node: below min the survivors wait, and a new node closes the round at once", "[rendezvous]") {
  RendezvousState s("job", rules(2, 3), sec(0));
  startRound(s, {"a", "b"});  // round 1 after the last call at 31s
  auto out = keepAlive(s, {"a"}, sec(32), sec(40));
  CHECK(render(out) == Lines{rejected("b", RejectCode::kEvicted, true), interrupted("a", 1)});
  CHECK_THAT(textFor(out, "a"), Contains("node b"));
  CHECK(s.phase() == Phase::kGathering);
  CHECK(s.round() == 1);
  CHECK(s.restartCount() == 0);

  CHECK(keepAlive(s, {"a"}, sec(41), sec(100)).empty());
  auto joined = join(s, "c", sec(100));  // no last call after an interruption
  CHECK(render(joined) == Lines{
                              assigned("a", 2, 0, 2, 0, 2, 0, "a"),
                              assigned("c", 2, 1, 2, 1, 2, 0, "a"),
                          });
  CHECK(s.phase() == Phase::kRunning);
  CHECK(s.round() == 2);
  CHECK(s.restartCount() == 0);
}

TEST_CASE("dead node: below min and nobody joins, the join timeout closes the job", "[rendezvous]") {
  auto r = rules(2, 3);
  r.joinTimeout = sec(60);
  RendezvousState s("job", r, sec(0));
  startRound(s, {"a", "b"});  // round 1 at 31s, both last seen then
  auto out = keepAlive(s, {"a"}, sec(32), sec(40));
  CHECK(render(out) == Lines{rejected("b", RejectCode::kEvicted, true), interrupted("a", 1)});
  CHECK(s.phase() == Phase::kGathering);
  // b was removed by the tick at 37s, so the wait for min runs until 37s + 60s.
  CHECK(s.nextDeadline() == sec(45) + kUs);  // a's heartbeat expiry comes first
  CHECK(keepAlive(s, {"a"}, sec(41), sec(96)).empty());
  CHECK(s.nextDeadline() == sec(97));
  CHECK(s.tick(sec(97) - kUs).empty());
  auto closed = s.tick(sec(97));
  CHECK(render(closed) == Lines{ended("a", false)});
  CHECK_THAT(textFor(closed, "a"), Contains("join timeout"));
  CHECK(s.phase() == Phase::kClosed);
}

TEST_CASE("dead nodes: two nodes silent in the same tick give one new round, not two", "[rendezvous]") {
  RendezvousState s("job", rules(2, 4), sec(0));
  startRound(s, {"a", "b", "c", "d"});
  CHECK(keepAlive(s, {"a", "b"}, sec(2), sec(6)).empty());
  auto out = s.tick(sec(6) + kUs);  // c and d were last seen at 1s
  CHECK(render(out) == Lines{
                           rejected("c", RejectCode::kEvicted, true),
                           rejected("d", RejectCode::kEvicted, true),
                           interrupted("a", 1),
                           interrupted("b", 1),
                           assigned("a", 2, 0, 2, 0, 2, 0, "a"),
                           assigned("b", 2, 1, 2, 1, 2, 0, "a"),
                       });
  CHECK(s.round() == 2);
  CHECK(s.members() == Lines{"a", "b"});
}

// ---- 5. worker failures and the restart budget ----------------------------------------------------

TEST_CASE("worker failure: restarts draw on one global budget", "[rendezvous]") {
  RendezvousState s("job", rules(3, 3, 2), sec(0));
  CHECK(join(s, "a", sec(1), 2).empty());
  CHECK(join(s, "b", sec(1), 3).empty());
  CHECK(join(s, "c", sec(1), 1).size() == 3);

  auto first = s.workerFailed("b", 1, sec(2));
  CHECK(render(first) == Lines{
                             interrupted("a", 1),
                             interrupted("b", 1),
                             interrupted("c", 1),
                             assigned("a", 2, 0, 3, 0, 6, 1, "a"),
                             assigned("b", 2, 1, 3, 2, 6, 1, "a"),
                             assigned("c", 2, 2, 3, 5, 6, 1, "a"),
                         });
  CHECK_THAT(textFor(first, "a"), Contains("node b"));
  CHECK(s.restartCount() == 1);
  CHECK(s.round() == 2);
  CHECK(s.members() == Lines{"a", "b", "c"});

  auto second = s.workerFailed("c", 2, sec(3));
  CHECK(render(second) == Lines{
                              interrupted("a", 2),
                              interrupted("b", 2),
                              interrupted("c", 2),
                              assigned("a", 3, 0, 3, 0, 6, 2, "a"),
                              assigned("b", 3, 1, 3, 2, 6, 2, "a"),
                              assigned("c", 3, 2, 3, 5, 6, 2, "a"),
                          });
  CHECK(s.restartCount() == 2);
  CHECK(s.round() == 3);

  auto third = s.workerFailed("a", 3, sec(4));
  CHECK(render(third) == Lines{ended("a", false), ended("b", false), ended("c", false)});
  for (const char* id : {"a", "b", "c"}) CHECK_THAT(textFor(third, id), Contains("budget"));
  CHECK(s.phase() == Phase::kClosed);
  CHECK(s.restartCount() == 2);
  CHECK(s.round() == 3);
  CHECK_FALSE(s.nextDeadline().has_value());
}

TEST_CASE("worker failure: with max_restarts=0 the first failure ends the job", "[rendezvous]") {
  RendezvousState s("job", rules(2, 2, 0), sec(0));
  startRound(s, {"a", "b"});
  auto out = s.workerFailed("a", 1, sec(2), ddprun::WorkerFailure{3, 7, 0, 7, "failed with exit code 7"});
  CHECK(render(out) == Lines{ended("a", false), ended("b", false)});
  CHECK_THAT(textFor(out, "b"), Contains("max_restarts=0"));
  CHECK_THAT(textFor(out, "b"), Contains("node a"));
  // Every node learns which worker ended the job, to exit with its status.
  for (const auto& n : out) {
    const auto* end = std::get_if<JobEnd>(&n.body);
    REQUIRE(end != nullptr);
    REQUIRE(end->failure.has_value());
    CHECK(end->failure->rank == 3);
    CHECK(end->failure->exitStatus == 7);
    CHECK(end->failedNode == "a");
  }
  CHECK(s.phase() == Phase::kClosed);
  CHECK(s.restartCount() == 0);

  // A later report (the other node's own failure, already too late) changes nothing.
  auto late = s.workerFailed("b", 1, sec(2), ddprun::WorkerFailure{0, 3, 0, 3, "failed with exit code 3"});
  for (const auto& n : late) CHECK_FALSE(std::holds_alternative<JobEnd>(n.body));
}

// ---- 6. fencing -----------------------------------------------------------------------------------

TEST_CASE("fencing: reports naming an older round are refused without effect", "[rendezvous]") {
  RendezvousState s("job", rules(2, 2, 3), sec(0));
  startRound(s, {"a", "b"});
  REQUIRE(s.workerFailed("a", 1, sec(2)).size() == 4);
  REQUIRE(s.round() == 2);
  REQUIRE(s.restartCount() == 1);

  auto staleFailure = s.workerFailed("b", 1, sec(3));
  CHECK(render(staleFailure) == Lines{rejected("b", RejectCode::kStaleRound, false)});
  CHECK_THAT(textFor(staleFailure, "b"), Contains("stale round"));
  auto staleSuccess = s.succeeded("b", 1, sec(3));
  CHECK(render(staleSuccess) == Lines{rejected("b", RejectCode::kStaleRound, false)});
  auto future = s.workerFailed("a", 3, sec(3));
  CHECK(render(future) == Lines{rejected("a", RejectCode::kStaleRound, false)});

  CHECK(s.round() == 2);
  CHECK(s.restartCount() == 1);
  CHECK(s.phase() == Phase::kRunning);
  CHECK(s.members() == Lines{"a", "b"});
  // The stale success did not count toward the exit barrier of round 2.
  CHECK(s.succeeded("a", 2, sec(4)).empty());
  CHECK(s.phase() == Phase::kRunning);
}

TEST_CASE("fencing: a report before any round is stale, and an unknown node is not joined", "[rendezvous]") {
  RendezvousState s("job", rules(2, 2, 3), sec(0));
  CHECK(join(s, "a", sec(1)).empty());
  CHECK(render(s.workerFailed("a", 0, sec(2))) == Lines{rejected("a", RejectCode::kStaleRound, false)});
  CHECK(render(s.workerFailed("a", 1, sec(2))) == Lines{rejected("a", RejectCode::kStaleRound, false)});
  CHECK(render(s.succeeded("a", 1, sec(2))) == Lines{rejected("a", RejectCode::kStaleRound, false)});
  CHECK(s.restartCount() == 0);
  CHECK(s.phase() == Phase::kGathering);

  CHECK(join(s, "b", sec(3)).size() == 2);
  CHECK(render(s.workerFailed("zz", 1, sec(4))) == Lines{rejected("zz", RejectCode::kNotJoined, true)});
  CHECK(render(s.succeeded("zz", 1, sec(4))) == Lines{rejected("zz", RejectCode::kNotJoined, true)});
  CHECK(render(s.heartbeat("zz", sec(4))) == Lines{rejected("zz", RejectCode::kNotJoined, true)});
  CHECK_FALSE(s.hasNode("zz"));
  CHECK(s.round() == 1);
  CHECK(s.restartCount() == 0);
  CHECK(s.members() == Lines{"a", "b"});
}

// ---- 7. duplicate ids, static ranks ---------------------------------------------------------------

TEST_CASE("duplicate node id: refused while the first is alive, accepted after it left", "[rendezvous]") {
  RendezvousState s("job", rules(2, 3), sec(0));
  CHECK(join(s, "a", sec(1)).empty());
  auto deadlineBefore = s.nextDeadline();

  auto dup = join(s, "a", sec(2), 4);
  CHECK(render(dup) == Lines{rejected("a", RejectCode::kDuplicateNode, true)});
  CHECK_THAT(textFor(dup, "a"), Contains("'a'"));
  CHECK(s.phase() == Phase::kGathering);
  CHECK(s.nextDeadline() == deadlineBefore);  // the refused join did not count as a heartbeat

  CHECK(s.leave("a", "stopped", sec(3)).empty());
  CHECK_FALSE(s.hasNode("a"));
  CHECK(join(s, "a", sec(4), 2).empty());
  CHECK(join(s, "b", sec(5)).empty());
  CHECK(render(join(s, "c", sec(6))) == Lines{
                                            assigned("a", 1, 0, 3, 0, 4, 0, "a"),
                                            assigned("b", 1, 1, 3, 2, 4, 0, "a"),
                                            assigned("c", 1, 2, 3, 3, 4, 0, "a"),
                                        });

  SECTION("a duplicate while the round runs changes nothing") {
    CHECK(render(join(s, "b", sec(7))) == Lines{rejected("b", RejectCode::kDuplicateNode, true)});
    CHECK(s.phase() == Phase::kRunning);
    CHECK(s.round() == 1);
    CHECK(s.members() == Lines{"a", "b", "c"});
  }
}

TEST_CASE("static mode: a rank is free again once its node left, and a restored state still knows it taken",
          "[rendezvous]") {
  RendezvousState s("job", rules(3, 3), sec(0));
  CHECK(join(s, "x", sec(1), 1, 2).empty());
  CHECK(render(join(s, "z", sec(2), 1, 2)) == Lines{rejected("z", RejectCode::kDuplicateNode, true)});
  CHECK(s.leave("x", "stopped", sec(3)).empty());
  CHECK(join(s, "z", sec(4), 1, 2).empty());  // rank 2 was freed with x
  auto restored = RendezvousState::restore(s.snapshot(sec(5)), sec(5));
  auto taken = restored.join(nodeInfo("w", 1, 2), sec(6));
  CHECK(render(taken) == Lines{rejected("w", RejectCode::kDuplicateNode, true)});
  CHECK_THAT(textFor(taken, "w"), Contains("taken by z"));
  CHECK(restored.join(nodeInfo("v", 1, 0), sec(7)).empty());
}

TEST_CASE("static mode: node_rank is the group rank, and a taken rank is refused", "[rendezvous]") {
  RendezvousState s("job", rules(3, 3), sec(0));
  CHECK(join(s, "x", sec(1), 1, 2).empty());
  CHECK(join(s, "y", sec(2), 2, 0).empty());
  auto taken = join(s, "z", sec(3), 1, 2);
  CHECK(render(taken) == Lines{rejected("z", RejectCode::kDuplicateNode, true)});
  CHECK_THAT(textFor(taken, "z"), Contains("node rank 2"));
  CHECK_FALSE(s.hasNode("z"));
  CHECK(s.phase() == Phase::kGathering);

  auto out = join(s, "w", sec(4), 3, 1);
  CHECK(render(out) == Lines{
                           assigned("y", 1, 0, 3, 0, 6, 0, "y"),
                           assigned("w", 1, 1, 3, 2, 6, 0, "y"),
                           assigned("x", 1, 2, 3, 5, 6, 0, "y"),
                       });
  CHECK(s.members() == Lines{"y", "w", "x"});
}

// ---- 8. joins while a round runs ------------------------------------------------------------------

TEST_CASE("a join while a round runs with room restarts it at once, including the joiner", "[rendezvous]") {
  RendezvousState s("job", rules(2, 3, 1), sec(0));
  startRound(s, {"a", "b"});
  auto out = join(s, "c", sec(40), 2);
  CHECK(render(out) == Lines{
                           interrupted("a", 1),
                           interrupted("b", 1),
                           assigned("a", 2, 0, 3, 0, 4, 0, "a"),
                           assigned("b", 2, 1, 3, 1, 4, 0, "a"),
                           assigned("c", 2, 2, 3, 2, 4, 0, "a"),
                       });
  CHECK_THAT(textFor(out, "a"), Contains("node c"));
  CHECK(s.round() == 2);
  CHECK(s.restartCount() == 0);
  CHECK(s.members() == Lines{"a", "b", "c"});
}

TEST_CASE("a join while a full round runs stands by until a member leaves", "[rendezvous]") {
  RendezvousState s("job", rules(2, 3), sec(0));
  startRound(s, {"a", "b", "c"});
  CHECK(join(s, "d", sec(2)).empty());
  CHECK(s.hasNode("d"));
  CHECK(s.phase() == Phase::kRunning);
  CHECK(s.round() == 1);
  CHECK(s.members() == Lines{"a", "b", "c"});
  // A standby node is not in the round: its reports are stale.
  CHECK(render(s.workerFailed("d", 1, sec(2))) == Lines{rejected("d", RejectCode::kStaleRound, false)});
  CHECK(s.restartCount() == 0);

  auto out = s.leave("b", "SIGTERM", sec(3));
  CHECK(render(out) == Lines{
                           interrupted("a", 1),
                           interrupted("c", 1),
                           assigned("a", 2, 0, 3, 0, 3, 0, "a"),
                           assigned("d", 2, 1, 3, 1, 3, 0, "a"),
                           assigned("c", 2, 2, 3, 2, 3, 0, "a"),
                       });
  CHECK(s.members() == Lines{"a", "d", "c"});
  CHECK(s.restartCount() == 0);
}

// ---- --finish_timeout: a rank that finished is told to the other members ------------------------

TEST_CASE("rank finished: the round's first is told to every other member, once", "[rendezvous]") {
  RendezvousState s("job", rules(3, 3), sec(0));
  join(s, "a", sec(1));
  join(s, "b", sec(1));
  join(s, "c", sec(1));
  REQUIRE(s.round() == 1);

  CHECK(render(s.rankFinished("b", 1, 1, sec(2))) == Lines{
                                                          "a: peer_finished round=1 rank=1 node=b",
                                                          "c: peer_finished round=1 rank=1 node=b",
                                                      });
  // Later finishes of the same round say nothing new.
  CHECK(s.rankFinished("c", 1, 2, sec(3)).empty());
  CHECK(s.rankFinished("b", 1, 1, sec(3)).empty());

  SECTION("a report of an older round is refused") {
    s.workerFailed("a", 1, sec(4), {0, 1, 0, 1, "failed"});
    REQUIRE(s.round() == 1);  // no restart budget: the job ended
    auto out = s.rankFinished("c", 1, 2, sec(5));
    REQUIRE(out.size() == 1);
    CHECK(std::holds_alternative<Rejection>(out[0].body));
  }
  SECTION("the next round announces its own first finish") {
    auto r = rules(3, 3);
    r.maxRestarts = 1;
    RendezvousState t("job", r, sec(0));
    join(t, "a", sec(1));
    join(t, "b", sec(1));
    join(t, "c", sec(1));
    t.rankFinished("a", 1, 0, sec(2));
    t.workerFailed("b", 1, sec(3), {1, 1, 0, 1, "failed"});
    for (const char* id : {"a", "b", "c"}) t.stopped(id, 1, sec(4));
    REQUIRE(t.round() == 2);
    CHECK(render(t.rankFinished("c", 2, 2, sec(5))) == Lines{
                                                           "a: peer_finished round=2 rank=2 node=c",
                                                           "b: peer_finished round=2 rank=2 node=c",
                                                       });
  }
}

TEST_CASE("stop without progress: a failure the agent says ends the job spends no restart", "[rendezvous]") {
  auto r = rules(2, 2);
  r.maxRestarts = 5;
  RendezvousState s("job", r, sec(0));
  join(s, "a", sec(1));
  join(s, "b", sec(1));
  REQUIRE(s.round() == 1);
  ddprun::WorkerFailure failure{1, 3, 0, 3, "failed with exit code 3"};
  failure.attemptsWithoutProgress = 2;
  auto out = s.workerFailed("b", 1, sec(2), failure);
  CHECK(s.phase() == Phase::kClosed);
  CHECK(s.restartCount() == 0);
  auto ends = bodiesFor<JobEnd>(out, "a");
  REQUIRE(ends.size() == 1);
  CHECK_FALSE(ends[0].succeeded);
  REQUIRE(ends[0].failure);
  CHECK(ends[0].failure->exitStatus == 3);
  CHECK_THAT(ends[0].reason, Catch::Contains("2 restarts in a row without progress"));
  CHECK_THAT(ends[0].reason, Catch::Contains("5 of 5 restarts left unspent"));
}

// ---- --exclude_node_after ------------------------------------------------------------------------

TEST_CASE("exclusion: the K-th failure of a node's workers excludes it, and a standby takes its place", "[rendezvous]") {
  auto r = rules(2, 2, 5);
  r.excludeNodeAfter = 2;
  RendezvousState s("job", r, sec(0));
  join(s, "a", sec(1));
  join(s, "b", sec(1));
  join(s, "c", sec(1));  // standby: the round is full
  REQUIRE(s.round() == 1);
  REQUIRE(s.members() == Lines{"a", "b"});

  s.workerFailed("b", 1, sec(2), {1, 3, 0, 3, "failed with exit code 3"});  // first: a restart
  REQUIRE(s.round() == 2);
  CHECK(s.restartCount() == 1);
  REQUIRE(s.members() == Lines{"a", "b"});

  auto out = s.workerFailed("b", 2, sec(3), {1, 3, 0, 3, "failed with exit code 3"});
  auto refusals = bodiesFor<Rejection>(out, "b");
  REQUIRE(refusals.size() == 1);
  CHECK(refusals[0].code == RejectCode::kExcluded);
  CHECK(refusals[0].fatal);
  CHECK_THAT(refusals[0].message, Catch::Contains("host host-b"));
  CHECK_FALSE(s.hasNode("b"));
  CHECK(s.restartCount() == 1);  // no restart spent: a membership change
  CHECK(s.round() == 3);
  CHECK(s.members() == Lines{"a", "c"});

  // An agent restarted on the same host has another node id: refused all the same, for good.
  auto again = s.join(ddprun::NodeInfo{"b2", 1, "host-b", portOf("b2"), -1, 0, false}, sec(4));
  REQUIRE(again.size() == 1);
  auto refused = std::get<Rejection>(again[0].body);
  CHECK(refused.code == RejectCode::kExcluded);
  CHECK_THAT(refused.message, Catch::Contains("host host-b is excluded from job 'job'"));

  SECTION("kept in a snapshot (the etcd driver's takeover)") {
    auto restored = RendezvousState::restore(s.snapshot(sec(5)), sec(0));
    auto refusedAfter = restored.join(ddprun::NodeInfo{"b3", 1, "host-b", portOf("b3"), -1, 0, false}, sec(1));
    REQUIRE(refusedAfter.size() == 1);
    CHECK(std::get<Rejection>(refusedAfter[0].body).code == RejectCode::kExcluded);
  }
}

TEST_CASE("exclusion: below min the survivors wait for a node to take the excluded one's place", "[rendezvous]") {
  auto r = rules(2, 2, 5);
  r.excludeNodeAfter = 1;
  RendezvousState s("job", r, sec(0));
  join(s, "a", sec(1));
  join(s, "b", sec(1));
  s.workerFailed("a", 1, sec(2), {0, 1, 0, 1, "failed"});
  CHECK_FALSE(s.hasNode("a"));
  CHECK(s.phase() == Phase::kGathering);  // b waits for a node to replace a (join timeout)
  join(s, "c", sec(3));
  CHECK(s.phase() == Phase::kRunning);
  CHECK(s.members() == Lines{"c", "b"});  // b keeps its group rank
}
