// Unit tests of the rendezvous state machine, continued (state_machine_test.cc has the rounds,
// dead nodes, budget, fencing and membership rules): interleavings of events that torchrun gets
// wrong, the exit barrier, rule validation and deadlines. Fake clock in microseconds.
#include <catch2/catch.hpp>

#include "state_machine_test_util.h"

using namespace ddprun::state_machine_test;

// ---- 9. interleavings -----------------------------------------------------------------------------

TEST_CASE("interleaving: a node dying during the last call cancels it, and the next join starts a new one",
          "[rendezvous]") {
  RendezvousState s("job", rules(2, 3), sec(0));
  CHECK(join(s, "a", sec(1)).empty());
  CHECK(join(s, "b", sec(2)).empty());  // last call until 32s
  auto quiet = keepAlive(s, {"a"}, sec(3), sec(31));
  // b dropped at 8s: only b is told (it may join again); nobody else while gathering.
  CHECK(render(quiet) == Lines{rejected("b", RejectCode::kEvicted, true)});
  CHECK_FALSE(s.hasNode("b"));
  CHECK(s.heartbeat("a", sec(32)).empty());
  CHECK(s.tick(sec(32)).empty());  // no round below min
  CHECK(s.phase() == Phase::kGathering);
  CHECK(s.round() == 0);

  CHECK(keepAlive(s, {"a"}, sec(33), sec(40)).empty());
  CHECK(join(s, "c", sec(40)).empty());  // min again: a fresh last call, until 70s
  CHECK(keepAlive(s, {"a", "c"}, sec(41), sec(69)).empty());
  CHECK(s.heartbeat("a", sec(70) - kUs).empty());
  CHECK(s.heartbeat("c", sec(70) - kUs).empty());
  CHECK(s.tick(sec(70) - kUs).empty());
  auto out = s.tick(sec(70));
  CHECK(render(out) == Lines{
                           assigned("a", 1, 0, 2, 0, 2, 0, "a"),
                           assigned("c", 1, 1, 2, 1, 2, 0, "a"),
                       });
}

TEST_CASE("interleaving: a join and a worker failure in the same instant", "[rendezvous]") {
  RendezvousState s("job", rules(2, 3, 3), sec(0));
  startRound(s, {"a", "b"});
  const Micros t = sec(40);

  SECTION("failure first, then the join") {
    auto failed = s.workerFailed("a", 1, t);
    CHECK(render(failed) == Lines{
                                interrupted("a", 1),
                                interrupted("b", 1),
                                assigned("a", 2, 0, 2, 0, 2, 1, "a"),
                                assigned("b", 2, 1, 2, 1, 2, 1, "a"),
                            });
    auto joined = join(s, "c", t);
    CHECK(render(joined) == Lines{
                                interrupted("a", 2),
                                interrupted("b", 2),
                                assigned("a", 3, 0, 3, 0, 3, 1, "a"),
                                assigned("b", 3, 1, 3, 1, 3, 1, "a"),
                                assigned("c", 3, 2, 3, 2, 3, 1, "a"),
                            });
    CHECK(s.round() == 3);
    CHECK(s.restartCount() == 1);
  }

  SECTION("join first, then the failure of the interrupted round") {
    auto joined = join(s, "c", t);
    CHECK(render(joined) == Lines{
                                interrupted("a", 1),
                                interrupted("b", 1),
                                assigned("a", 2, 0, 3, 0, 3, 0, "a"),
                                assigned("b", 2, 1, 3, 1, 3, 0, "a"),
                                assigned("c", 2, 2, 3, 2, 3, 0, "a"),
                            });
    // The failure names round 1, which the join already ended: fenced, no second restart.
    CHECK(render(s.workerFailed("a", 1, t)) == Lines{rejected("a", RejectCode::kStaleRound, false)});
    CHECK(s.round() == 2);
    CHECK(s.restartCount() == 0);
  }
}

TEST_CASE("interleaving: an agent from a round this state never had is refused (server lost its state)",
          "[rendezvous]") {
  RendezvousState s("job", rules(2, 2), sec(0));
  auto out = join(s, "a", sec(1), 1, -1, 3);
  CHECK(render(out) == Lines{rejected("a", RejectCode::kStaleRound, true)});
  CHECK_THAT(textFor(out, "a"), Contains("round 3"));
  CHECK_FALSE(s.hasNode("a"));

  startRound(s, {"a", "b"});
  CHECK(render(join(s, "c", sec(2), 1, -1, 2)) == Lines{rejected("c", RejectCode::kStaleRound, true)});
  CHECK(s.leave("b", "restarting", sec(3)).size() == 1);  // a interrupted, below min
  CHECK(join(s, "b", sec(4), 1, -1, 1).size() == 2);      // a node of round 1 may come back
  CHECK(s.round() == 2);
}

TEST_CASE("interleaving: the endpoint host (rank 0) stopped by a signal hands master to a survivor",
          "[rendezvous]") {
  RendezvousState s("job", rules(2, 3), sec(0));
  startRound(s, {"a", "b", "c"});
  auto out = s.leave("a", "stopped by SIGTERM", sec(2));
  // b keeps rank 1; c cannot keep rank 2 in a round of 2 and fills rank 0, so c hosts the master.
  CHECK(render(out) == Lines{
                           interrupted("b", 1),
                           interrupted("c", 1),
                           assigned("c", 2, 0, 2, 0, 2, 0, "c"),
                           assigned("b", 2, 1, 2, 1, 2, 0, "c"),
                       });
  CHECK_THAT(textFor(out, "b"), Contains("node a"));
  auto toB = bodiesFor<RoundAssignment>(out, "b");
  REQUIRE(toB.size() == 1);
  CHECK(toB[0].masterAddr == "host-c");
  CHECK(toB[0].masterPort == portOf("c"));
  CHECK(s.phase() == Phase::kRunning);  // a signal on one agent does not close the job
  CHECK(s.members() == Lines{"c", "b"});
}

TEST_CASE("interleaving: two failures of the same round from two nodes spend one restart", "[rendezvous]") {
  RendezvousState s("job", rules(2, 2, 3), sec(0));
  startRound(s, {"a", "b"});
  auto first = s.workerFailed("a", 1, sec(2));
  CHECK(render(first) == Lines{
                             interrupted("a", 1),
                             interrupted("b", 1),
                             assigned("a", 2, 0, 2, 0, 2, 1, "a"),
                             assigned("b", 2, 1, 2, 1, 2, 1, "a"),
                         });
  auto second = s.workerFailed("b", 1, sec(2));
  CHECK(render(second) == Lines{rejected("b", RejectCode::kStaleRound, false)});
  CHECK(s.restartCount() == 1);
  CHECK(s.round() == 2);
}

// ---- 10. exit barrier -----------------------------------------------------------------------------

TEST_CASE("exit barrier: the job succeeds when every member reported success", "[rendezvous]") {
  RendezvousState s("job", rules(3, 3), sec(0));
  startRound(s, {"a", "b", "c"});
  CHECK(s.succeeded("a", 1, sec(2)).empty());
  CHECK(s.succeeded("a", 1, sec(3)).empty());  // twice from one node is still one node
  CHECK(s.succeeded("b", 1, sec(4)).empty());
  CHECK(s.phase() == Phase::kRunning);
  auto out = s.succeeded("c", 1, sec(5));
  CHECK(render(out) == Lines{ended("a", true), ended("b", true), ended("c", true)});
  CHECK(s.phase() == Phase::kClosed);
  CHECK_FALSE(s.nextDeadline().has_value());

  CHECK(render(join(s, "d", sec(6))) == Lines{rejected("d", RejectCode::kJobClosed, true)});
  CHECK_FALSE(s.hasNode("d"));
  // Reports after the end are refused and change nothing.
  auto late = s.workerFailed("a", 1, sec(6));
  REQUIRE(late.size() == 1);
  CHECK(late[0].nodeId == "a");
  CHECK(std::holds_alternative<Rejection>(late[0].body));
  CHECK(s.tick(sec(1000)).empty());
  CHECK(s.phase() == Phase::kClosed);
}

TEST_CASE("exit barrier: a member that succeeded and left neither blocks nor interrupts", "[rendezvous]") {
  RendezvousState s("job", rules(3, 3), sec(0));
  startRound(s, {"a", "b", "c"});
  CHECK(s.succeeded("a", 1, sec(2)).empty());

  SECTION("it left") { CHECK(s.leave("a", "agent exited", sec(3)).empty()); }
  SECTION("it went silent") {
    CHECK(keepAlive(s, {"b", "c"}, sec(3), sec(7)).empty());
    // a last seen at 2s: told it is out; its success stands, so the others are not interrupted.
    CHECK(render(s.tick(sec(7) + kUs)) == Lines{rejected("a", RejectCode::kEvicted, true)});
  }
  CHECK_FALSE(s.hasNode("a"));
  CHECK(s.phase() == Phase::kRunning);
  CHECK(s.round() == 1);
  CHECK(s.succeeded("b", 1, sec(8)).empty());
  auto out = s.succeeded("c", 1, sec(8));
  CHECK(render(out) == Lines{ended("b", true), ended("c", true)});
  CHECK(s.phase() == Phase::kClosed);
}

TEST_CASE("exit barrier: a member that succeeded, left and came back as standby does not block it",
          "[rendezvous]") {
  RendezvousState s("job", rules(3, 3), sec(0));
  startRound(s, {"a", "b", "c"});
  CHECK(s.succeeded("a", 1, sec(2)).empty());
  CHECK(s.leave("a", "agent exited", sec(3)).empty());
  CHECK(join(s, "a", sec(4), 1, -1, 1).empty());  // the round is full (a's slot is still counted)
  CHECK(s.succeeded("b", 1, sec(5)).empty());
  // Every member of round 1 reported success, so the job is over.
  auto out = s.succeeded("c", 1, sec(6));
  CHECK(render(out) == Lines{ended("a", true), ended("b", true), ended("c", true)});
  CHECK(s.phase() == Phase::kClosed);
}

// ---- 11. validateRules ----------------------------------------------------------------------------

TEST_CASE("validateRules accepts a normal config and rejects impossible ones", "[rendezvous]") {
  auto valid = [](const RendezvousRules& r) { return !RendezvousState::validateRules(r).has_value(); };
  CHECK(valid(RendezvousRules{}));
  CHECK(valid(rules(2, 4, 3)));
  CHECK(valid(rules(1, 1, 0)));

  auto r = rules(2, 4, 3);
  r.minNodes = 0;
  CHECK_FALSE(valid(r));
  r.minNodes = -1;
  CHECK_FALSE(valid(r));
  CHECK_FALSE(valid(rules(3, 2)));
  CHECK_FALSE(valid(rules(2, 4, -1)));

  r = rules(2, 4, 3);
  r.joinTimeout = Micros(0);
  CHECK_FALSE(valid(r));
  r.joinTimeout = sec(-1);
  CHECK_FALSE(valid(r));
  r = rules(2, 4, 3);
  r.heartbeatTimeout = Micros(0);
  CHECK_FALSE(valid(r));
  r.heartbeatTimeout = sec(-5);
  CHECK_FALSE(valid(r));
  r = rules(2, 4, 3);
  r.lastCallTimeout = sec(-1);
  CHECK_FALSE(valid(r));
  // A zero last call is accepted on purpose ("close at the first tick after min joined").
  r.lastCallTimeout = Micros(0);
  CHECK(valid(r));

  auto reason = RendezvousState::validateRules(rules(3, 2));
  REQUIRE(reason.has_value());
  CHECK_THAT(*reason, Contains("min"));
  reason = RendezvousState::validateRules(rules(2, 4, -1));
  REQUIRE(reason.has_value());
  CHECK_THAT(*reason, Contains("max_restarts"));
}

// ---- 12. nextDeadline -----------------------------------------------------------------------------

TEST_CASE("nextDeadline: the earliest heartbeat expiry or gathering deadline, none after close",
          "[rendezvous]") {
  RendezvousState s("job", rules(2, 3), sec(0));
  CHECK(s.nextDeadline() == sec(600));  // nobody yet: the join timeout

  CHECK(join(s, "a", sec(1)).empty());
  // A node expires one microsecond after lastSeen + heartbeatTimeout (tick removes strictly after).
  CHECK(s.nextDeadline() == sec(6) + kUs);
  CHECK(join(s, "b", sec(2)).empty());
  CHECK(s.nextDeadline() == sec(6) + kUs);
  CHECK(s.heartbeat("a", sec(4)).empty());
  CHECK(s.nextDeadline() == sec(7) + kUs);  // now b's expiry is the earliest

  CHECK(s.tick(*s.nextDeadline() - kUs).empty());
  CHECK(s.hasNode("b"));
  CHECK(render(s.tick(*s.nextDeadline())) == Lines{rejected("b", RejectCode::kEvicted, true)});
  CHECK_FALSE(s.hasNode("b"));
  CHECK(s.nextDeadline() == sec(9) + kUs);  // a, last seen at 4s

  CHECK(s.heartbeat("a", sec(8)).empty());
  CHECK(join(s, "b", sec(8)).empty());
  CHECK(join(s, "c", sec(9)).size() == 3);  // max: round 1
  CHECK(s.phase() == Phase::kRunning);
  CHECK(s.nextDeadline() == sec(13) + kUs);  // a and b, last seen at 8s

  CHECK(s.succeeded("a", 1, sec(10)).empty());
  CHECK(s.succeeded("b", 1, sec(10)).empty());
  CHECK(s.succeeded("c", 1, sec(10)).size() == 3);
  CHECK(s.phase() == Phase::kClosed);
  CHECK_FALSE(s.nextDeadline().has_value());
}

// ---- a one-node job: what the single-node launcher runs (LocalRendezvous drives this state) ------

TEST_CASE("one-node job: closes at once, restarts within the budget, then fails with the worker's failure",
          "[rendezvous]") {
  RendezvousState s("job", rules(1, 1, 2), sec(0));
  CHECK(render(join(s, "a", sec(0), 4, 0)) == Lines{assigned("a", 1, 0, 1, 0, 4, 0, "a")});
  auto first = s.workerFailed("a", 1, sec(1));
  CHECK(render(first) == Lines{interrupted("a", 1), assigned("a", 2, 0, 1, 0, 4, 1, "a")});
  CHECK(render(s.workerFailed("a", 2, sec(2))) == Lines{interrupted("a", 2), assigned("a", 3, 0, 1, 0, 4, 2, "a")});
  auto last = s.workerFailed("a", 3, sec(3), ddprun::WorkerFailure{1, 3, 0, 3, "failed with exit code 3"});
  CHECK(render(last) == Lines{ended("a", false)});
  CHECK_THAT(textFor(last, "a"), Contains("restart budget (2) is spent"));
  REQUIRE(bodiesFor<JobEnd>(last, "a").at(0).failure.has_value());
  CHECK(bodiesFor<JobEnd>(last, "a").at(0).failure->exitStatus == 3);
  // Closed: nothing more is decided.
  CHECK(render(s.workerFailed("a", 3, sec(4))) == Lines{rejected("a", RejectCode::kStaleRound, false)});
  CHECK(render(s.succeeded("a", 3, sec(4))) == Lines{rejected("a", RejectCode::kStaleRound, false)});
}

TEST_CASE("one-node job: success closes it, a stale report is refused, and leave ends every report",
          "[rendezvous]") {
  RendezvousState s("job", rules(1, 1, 3), sec(0));
  join(s, "a", sec(0), 2, 0);
  s.workerFailed("a", 1, sec(1));
  REQUIRE(s.round() == 2);
  // A second worker of round 1 reporting late spends nothing.
  CHECK(render(s.workerFailed("a", 1, sec(2))) == Lines{rejected("a", RejectCode::kStaleRound, false)});
  CHECK(render(s.succeeded("a", 1, sec(2))) == Lines{rejected("a", RejectCode::kStaleRound, false)});
  CHECK(s.restartCount() == 1);
  CHECK(render(s.succeeded("a", 2, sec(3))) == Lines{ended("a", true)});

  RendezvousState t("job", rules(1, 1, 3), sec(0));
  join(t, "a", sec(0), 2, 0);
  CHECK(t.leave("a", "stopped by a signal", sec(1)).empty());
  CHECK(render(t.workerFailed("a", 1, sec(2))) == Lines{rejected("a", RejectCode::kNotJoined, true)});
  CHECK(t.restartCount() == 0);
}
