// The hand-over between rounds (rendezvous/rules/state_machine.h): after an interruption the next round
// closes only once every member of the old one reported its workers stopped, left for good, or
// was evicted. Nodes join with reportsStopped set, as ddprun's agents do; one without it (an older
// agent) is not waited for.
#include <catch2/catch.hpp>

#include "state_machine_test_util.h"

using namespace ddprun::state_machine_test;

namespace {

std::vector<Notice> joinReporting(RendezvousState& s, const std::string& id, Micros now, bool reports = true) {
  NodeInfo n = nodeInfo(id);
  n.reportsStopped = reports;
  return s.join(n, now);
}

// a and b in round 1 of a --nnodes=2:3 job.
RendezvousState twoNodesRunning(int maxRestarts = 1) {
  auto r = rules(2, 3, maxRestarts);
  r.lastCallTimeout = sec(1);
  RendezvousState s("job", r, sec(0));
  joinReporting(s, "a", sec(1));
  joinReporting(s, "b", sec(1));
  s.tick(sec(2));
  REQUIRE(s.phase() == Phase::kRunning);
  REQUIRE(s.round() == 1);
  return s;
}

// a, b and the newcomer c in round 2 (a and b answered the scale-up's interruption at 3 s).
RendezvousState threeNodesInRoundTwo() {
  RendezvousState s = twoNodesRunning();
  joinReporting(s, "c", sec(3));
  s.stopped("a", 1, sec(3));
  s.stopped("b", 1, sec(3));
  REQUIRE(s.round() == 2);
  return s;
}

}  // namespace

TEST_CASE("hand-over: a newcomer's round waits until every member reported its workers stopped", "[rendezvous]") {
  RendezvousState s = twoNodesRunning();
  CHECK(render(joinReporting(s, "c", sec(3))) == Lines{interrupted("a", 1), interrupted("b", 1)});
  CHECK(s.phase() == Phase::kGathering);
  CHECK(s.stopped("a", 1, sec(4)).empty());
  CHECK(s.phase() == Phase::kGathering);  // b's workers may still run
  CHECK(s.stopped("a", 1, sec(4)).empty());  // a repeated report changes nothing
  auto out = s.stopped("b", 1, sec(5));
  CHECK(render(out) == Lines{
                           assigned("a", 2, 0, 3, 0, 3, 0, "a"),
                           assigned("b", 2, 1, 3, 1, 3, 0, "a"),
                           assigned("c", 2, 2, 3, 2, 3, 0, "a"),
                       });
  CHECK(s.restartCount() == 0);
}

TEST_CASE("hand-over: a worker failure's restart waits for every member, the failed node included", "[rendezvous]") {
  RendezvousState s = twoNodesRunning();
  CHECK(render(s.workerFailed("a", 1, sec(3))) == Lines{interrupted("a", 1), interrupted("b", 1)});
  CHECK(s.stopped("b", 1, sec(3)).empty());
  CHECK(s.phase() == Phase::kGathering);
  CHECK(render(s.stopped("a", 1, sec(4))).size() == 2);
  CHECK(s.round() == 2);
  CHECK(s.restartCount() == 1);
}

TEST_CASE("hand-over: a report for an older round does not answer a newer interruption", "[rendezvous]") {
  RendezvousState s = twoNodesRunning(3);
  s.workerFailed("a", 1, sec(3));
  s.stopped("a", 1, sec(3));
  s.stopped("b", 1, sec(3));
  REQUIRE(s.round() == 2);
  s.workerFailed("b", 2, sec(4));
  CHECK(s.stopped("a", 1, sec(4)).empty());  // late, from the first hand-over
  CHECK(s.stopped("b", 2, sec(4)).empty());
  CHECK(s.phase() == Phase::kGathering);
  CHECK(render(s.stopped("a", 2, sec(5))).size() == 2);
  CHECK(s.round() == 3);
}

TEST_CASE("hand-over: a member that leaves by a signal is out of the next round but holds it until its workers stop",
          "[rendezvous]") {
  RendezvousState s = threeNodesInRoundTwo();
  CHECK(render(s.leave("c", "agent stopped by a signal", sec(4), true)) ==
        Lines{interrupted("a", 2), interrupted("b", 2)});
  CHECK(s.hasNode("c"));
  s.stopped("a", 2, sec(4));
  CHECK(s.stopped("b", 2, sec(4)).empty());  // c's workers still run
  CHECK(s.phase() == Phase::kGathering);
  auto out = s.stopped("c", 2, sec(5));
  CHECK(render(out) == Lines{
                           assigned("a", 3, 0, 2, 0, 2, 0, "a"),
                           assigned("b", 3, 1, 2, 1, 2, 0, "a"),
                       });
  CHECK_FALSE(s.hasNode("c"));

  SECTION("a heartbeat of the leaving node keeps it, its stream's end removes it") {
    RendezvousState t = threeNodesInRoundTwo();
    t.leave("c", "agent stopped by a signal", sec(4), true);
    t.stopped("a", 2, sec(4));
    t.stopped("b", 2, sec(4));
    CHECK(t.heartbeat("c", sec(5)).empty());
    CHECK(render(t.leave("c", "stream closed", sec(6))).size() == 2);
    CHECK(t.round() == 3);
  }
}

TEST_CASE("hand-over: a member that never reports is evicted after the join timeout, its heartbeats notwithstanding",
          "[rendezvous]") {
  RendezvousState s = twoNodesRunning();
  joinReporting(s, "c", sec(3));
  s.stopped("a", 1, sec(3));
  for (int t = 4; t <= 603; ++t) {
    s.heartbeat("a", sec(t));
    s.heartbeat("b", sec(t));
    s.heartbeat("c", sec(t));
  }
  CHECK(s.phase() == Phase::kGathering);
  CHECK(s.nextDeadline() == sec(3) + sec(600) + kUs);  // no busy tick on the passed last call
  auto out = s.tick(sec(603) + kUs);
  CHECK(render(out, true).front().find("b: reject evicted fatal (declared dead: its workers did not stop") == 0);
  CHECK(render(out).size() == 3);  // b's eviction, then a round of a and c
  CHECK(s.round() == 2);
  CHECK_FALSE(s.hasNode("b"));
}

TEST_CASE("hand-over: members whose agents do not report (older agents) and members that succeeded are not waited for",
          "[rendezvous]") {
  auto r = rules(2, 3, 1);
  r.lastCallTimeout = sec(1);
  RendezvousState s("job", r, sec(0));
  joinReporting(s, "a", sec(1));
  joinReporting(s, "b", sec(1), false);
  s.tick(sec(2));
  REQUIRE(s.round() == 1);
  s.succeeded("a", 1, sec(3));
  // a succeeded, b does not report: a newcomer's round closes at once.
  auto out = joinReporting(s, "c", sec(4));
  CHECK(render(out).size() == 5);  // two interruptions, three assignments
  CHECK(s.round() == 2);
}

TEST_CASE("hand-over: a stopping node and a leaving one survive a snapshot", "[rendezvous]") {
  RendezvousState s = threeNodesInRoundTwo();
  s.leave("c", "agent stopped by a signal", sec(4), true);
  s.stopped("a", 2, sec(4));
  RendezvousState t = RendezvousState::restore(s.snapshot(sec(4)), sec(100));
  CHECK(t.stopped("b", 2, sec(101)).empty());
  CHECK(t.phase() == Phase::kGathering);
  CHECK(render(t.stopped("c", 2, sec(102))).size() == 2);
  CHECK(t.round() == 3);
  CHECK_FALSE(t.hasNode("c"));
}
