// RendezvousState::snapshot/restore (the etcd backend's driver takeover, docs/etcd.md): a state
// restored on another clock answers every later event exactly as the original would, deadlines
// included (kept as time left), and round numbers and the restart budget go on.
#include "state_machine_test_util.h"

using namespace ddprun::state_machine_test;

namespace {

// The original at time t, and its restored twin on a clock `shift` ahead (another host).
constexpr Micros kShift = Micros(int64_t{987654321});

}  // namespace

TEST_CASE("snapshot: a restored state keeps a pending last call as time left on its own clock", "[rendezvous][snapshot]") {
  auto r = rules(2, 4);
  r.heartbeatTimeout = sec(120);
  RendezvousState s("job", r, sec(0));
  join(s, "a", sec(1));
  join(s, "b", sec(2));  // last call due at 32 s
  RendezvousState twin = RendezvousState::restore(s.snapshot(sec(10)), sec(10) + kShift);
  CHECK(twin.phase() == Phase::kGathering);
  CHECK(twin.nextDeadline() == sec(32) + kShift);
  CHECK(twin.tick(sec(32) + kShift - kUs).empty());
  CHECK(render(twin.tick(sec(32) + kShift)) == render(s.tick(sec(32))));
  CHECK(twin.round() == 1);
}

TEST_CASE("snapshot: a restored running round answers failures, joins and successes as the original", "[rendezvous][snapshot]") {
  auto r = rules(2, 3, /*maxRestarts=*/2);
  r.heartbeatTimeout = sec(120);
  RendezvousState s("job", r, sec(0));
  join(s, "a", sec(1));
  join(s, "b", sec(1));
  join(s, "c", sec(1));  // max: round 1 at once
  s.workerFailed("c", 1, sec(2));  // round 2, one restart spent
  REQUIRE(s.round() == 2);
  s.succeeded("a", 2, sec(3));     // one of three members through the exit barrier
  RendezvousState twin = RendezvousState::restore(s.snapshot(sec(4)), sec(4) + kShift);
  CHECK(twin.round() == 2);
  CHECK(twin.restartCount() == 1);
  CHECK(twin.members() == s.members());
  CHECK(twin.isCurrentRound(2));

  SECTION("a node leaving restarts the others with their ranks, as the original") {
    CHECK(render(twin.leave("b", "gone", sec(5) + kShift)) == render(s.leave("b", "gone", sec(5))));
    CHECK(twin.round() == 3);
  }
  SECTION("the remaining successes end the job, as the original") {
    CHECK(render(twin.succeeded("b", 2, sec(5) + kShift)) == render(s.succeeded("b", 2, sec(5))));
    auto end = twin.succeeded("c", 2, sec(6) + kShift);
    CHECK(render(end) == render(s.succeeded("c", 2, sec(6))));
    CHECK(twin.phase() == Phase::kClosed);
  }
  SECTION("failures spend the same budget and a stale report is refused, as the original") {
    CHECK(render(twin.workerFailed("a", 2, sec(5) + kShift), true) == render(s.workerFailed("a", 2, sec(5)), true));
    CHECK(render(twin.workerFailed("b", 2, sec(6) + kShift), true) == render(s.workerFailed("b", 2, sec(6)), true));
    CHECK(twin.restartCount() == 2);
    CHECK(render(twin.workerFailed("c", 3, sec(7) + kShift), true) == render(s.workerFailed("c", 3, sec(7)), true));
    CHECK(twin.phase() == s.phase());
  }
}

TEST_CASE("snapshot: restored nodes count as seen at the restore, heartbeats are due from then", "[rendezvous][snapshot]") {
  auto r = rules(1, 2);
  r.heartbeatTimeout = sec(5);
  RendezvousState s("job", r, sec(0));
  join(s, "a", sec(0));
  join(s, "b", sec(0));
  // At 4 s the originals' heartbeats are 1 s from due; the successor gives them a full timeout.
  RendezvousState twin = RendezvousState::restore(s.snapshot(sec(4)), sec(4) + kShift);
  CHECK(twin.tick(sec(9) + kShift).empty());
  CHECK(render(twin.tick(sec(9) + kShift + kUs)).size() > 0);  // both silent past the timeout: job notices
}

// The running round's first RankFinished is told once (PeerFinish): a successor that forgot it had
// been told told the other members again, restarting their --finish_timeout. The snapshot copied
// its fields by hand and left this one out.
TEST_CASE("snapshot: a restored state remembers that the round's first finish was told", "[rendezvous][snapshot]") {
  auto r = rules(2, 2);
  r.heartbeatTimeout = sec(120);
  RendezvousState s("job", r, sec(0));
  join(s, "a", sec(1));
  join(s, "b", sec(1));  // max: round 1 at once
  REQUIRE(s.rankFinished("a", 1, 0, sec(2)).size() == 1);  // told to b
  RendezvousState twin = RendezvousState::restore(s.snapshot(sec(3)), sec(3) + kShift);
  CHECK(twin.rankFinished("b", 1, 1, sec(4) + kShift).empty());
  CHECK(s.rankFinished("b", 1, 1, sec(4)).empty());
}

TEST_CASE("snapshot: every field survives restore and snapshot again", "[rendezvous][snapshot]") {
  const RendezvousState::Snapshot s = everyFieldSet();
  CHECK(RendezvousState::restore(s, sec(40)).snapshot(sec(40)) == s);
  // Deadlines are time left: on another clock, later, they are as much shorter.
  auto later = RendezvousState::restore(s, sec(40) + kShift).snapshot(sec(41) + kShift);
  CHECK(later.joinDeadlineLeft == sec(10));
  CHECK(later.lastCallDeadlineLeft == sec(2));
  later.joinDeadlineLeft = s.joinDeadlineLeft;
  later.lastCallDeadlineLeft = s.lastCallDeadlineLeft;
  CHECK(later == s);
}
