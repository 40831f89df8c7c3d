// Unit tests of the rendezvous state machine (rendezvous/state_machine.h): every rule of DESIGN.md
// "Rendezvous", driven by a fake clock in microseconds. Notices are rendered to one line each so a
// test can state exactly who gets what (round, ranks, offsets, world size, restart count, master)
// and Catch prints the whole batch when it differs.
#include "rendezvous/state_machine.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

namespace {

using Catch::Matchers::Contains;
using ddprun::JobEnd;
using ddprun::Micros;
using ddprun::NodeInfo;
using ddprun::Notice;
using ddprun::RejectCode;
using ddprun::Rejection;
using ddprun::RendezvousRules;
using ddprun::RendezvousState;
using ddprun::RoundAssignment;
using ddprun::RoundInterruption;
using Phase = RendezvousState::Phase;
using Lines = std::vector<std::string>;

constexpr Micros kUs{1};

Micros sec(int64_t n) { return Micros(n * 1000000); }

// Every test node "x" lives on host "host-x" and offers its own port, so a master address names
// exactly one node.
std::string hostOf(const std::string& id) { return "host-" + id; }
int portOf(const std::string& id) {
  int port = 30000;
  for (char ch : id) port += static_cast<unsigned char>(ch);
  return port;
}

NodeInfo nodeInfo(const std::string& id, int localWorldSize = 1, int nodeRank = -1, uint64_t lastRound = 0) {
  NodeInfo n;
  n.nodeId = id;
  n.localWorldSize = localWorldSize;
  n.host = hostOf(id);
  n.masterPort = portOf(id);
  n.nodeRank = nodeRank;
  n.lastRound = lastRound;
  return n;
}

std::vector<Notice> join(RendezvousState& s, const std::string& id, Micros now, int localWorldSize = 1,
                         int nodeRank = -1, uint64_t lastRound = 0) {
  return s.join(nodeInfo(id, localWorldSize, nodeRank, lastRound), now);
}

RendezvousRules rules(int minNodes, int maxNodes, int maxRestarts = 0) {
  RendezvousRules r;
  r.minNodes = minNodes;
  r.maxNodes = maxNodes;
  r.maxRestarts = maxRestarts;
  r.joinTimeout = sec(600);
  r.lastCallTimeout = sec(30);
  r.heartbeatTimeout = sec(5);
  return r;
}

const char* codeName(RejectCode code) {
  switch (code) {
    case RejectCode::kStaleRound: return "stale_round";
    case RejectCode::kDuplicateNode: return "duplicate_node";
    case RejectCode::kJobClosed: return "job_closed";
    case RejectCode::kRulesMismatch: return "rules_mismatch";
    case RejectCode::kMalformed: return "malformed";
    case RejectCode::kNotJoined: return "not_joined";
  }
  return "?";
}

// One line per notice; reasons and messages only when asked (tests check them with Contains).
std::string render(const Notice& n, bool withText = false) {
  std::string line = n.nodeId + ": ";
  std::visit(
      [&](const auto& b) {
        using T = std::decay_t<decltype(b)>;
        if constexpr (std::is_same_v<T, RoundAssignment>) {
          line += "assign round=" + std::to_string(b.round) + " rank=" + std::to_string(b.groupRank) + "/" +
                  std::to_string(b.groupWorldSize) + " offset=" + std::to_string(b.rankOffset) +
                  " world=" + std::to_string(b.worldSize) + " restarts=" + std::to_string(b.restartCount) +
                  " master=" + b.masterAddr + ":" + std::to_string(b.masterPort);
        } else if constexpr (std::is_same_v<T, RoundInterruption>) {
          line += "interrupt round=" + std::to_string(b.round);
          if (withText) line += " (" + b.reason + ")";
        } else if constexpr (std::is_same_v<T, JobEnd>) {
          line += b.succeeded ? "end succeeded" : "end failed";
          if (withText) line += " (" + b.reason + ")";
        } else {
          line += std::string("reject ") + codeName(b.code) + (b.fatal ? " fatal" : " nonfatal");
          if (withText) line += " (" + b.message + ")";
        }
      },
      n.body);
  return line;
}

Lines render(const std::vector<Notice>& out, bool withText = false) {
  Lines lines;
  for (const auto& n : out) lines.push_back(render(n, withText));
  return lines;
}

std::string assigned(const std::string& id, uint64_t round, int rank, int size, int offset, int world, int restarts,
                     const std::string& master) {
  return id + ": assign round=" + std::to_string(round) + " rank=" + std::to_string(rank) + "/" +
         std::to_string(size) + " offset=" + std::to_string(offset) + " world=" + std::to_string(world) +
         " restarts=" + std::to_string(restarts) + " master=" + hostOf(master) + ":" + std::to_string(portOf(master));
}
std::string interrupted(const std::string& id, uint64_t round) {
  return id + ": interrupt round=" + std::to_string(round);
}
std::string ended(const std::string& id, bool succeeded) {
  return id + (succeeded ? ": end succeeded" : ": end failed");
}
std::string rejected(const std::string& id, RejectCode code, bool fatal) {
  return id + ": reject " + codeName(code) + (fatal ? " fatal" : " nonfatal");
}

// The bodies of type T addressed to one node, in order.
template <class T>
std::vector<T> bodiesFor(const std::vector<Notice>& out, const std::string& id) {
  std::vector<T> found;
  for (const auto& n : out) {
    if (n.nodeId == id) {
      if (const T* b = std::get_if<T>(&n.body)) found.push_back(*b);
    }
  }
  return found;
}

// The reason (or rejection message) of the first interruption, job end or rejection sent to `id`.
std::string textFor(const std::vector<Notice>& out, const std::string& id) {
  for (const auto& n : out) {
    if (n.nodeId != id) continue;
    if (auto* i = std::get_if<RoundInterruption>(&n.body)) return i->reason;
    if (auto* e = std::get_if<JobEnd>(&n.body)) return e->reason;
    if (auto* r = std::get_if<Rejection>(&n.body)) return r->message;
  }
  return "<no text for " + id + ">";
}

void append(std::vector<Notice>& all, std::vector<Notice> more) {
  for (auto& n : more) all.push_back(std::move(n));
}

// Heartbeats `ids` and ticks once a second from `from` to `to` (inclusive); returns every notice.
std::vector<Notice> keepAlive(RendezvousState& s, const std::vector<std::string>& ids, Micros from, Micros to) {
  std::vector<Notice> all;
  for (Micros t = from; t <= to; t += sec(1)) {
    for (const auto& id : ids) append(all, s.heartbeat(id, t));
    append(all, s.tick(t));
  }
  return all;
}

// A running round 1 of the given nodes (all join at 1s, one local worker each). When fewer than
// max nodes join, the last call runs out at 1s + lastCallTimeout while all of them heartbeat once
// a second, so they were last seen at that instant.
void startRound(RendezvousState& s, const std::vector<std::string>& ids) {
  std::vector<Notice> all;
  for (const auto& id : ids) append(all, join(s, id, sec(1)));
  if (s.phase() == Phase::kGathering) append(all, keepAlive(s, ids, sec(2), sec(1) + s.rules().lastCallTimeout));
  REQUIRE(s.phase() == Phase::kRunning);
  REQUIRE(s.round() == 1);
  REQUIRE(s.members() == ids);
  REQUIRE(bodiesFor<RoundAssignment>(all, ids.front()).size() == 1);
}

}  // namespace

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
  REQUIRE(all.size() == 3 + 2 + 2);  // round 1, then the interruption and round 2
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
  CHECK(render(out) == Lines{interrupted("a", 1)});
  CHECK_FALSE(s.hasNode("b"));
}

TEST_CASE("dead node: below min the survivors wait, and a new node closes the round at once", "[rendezvous]") {
  RendezvousState s("job", rules(2, 3), sec(0));
  startRound(s, {"a", "b"});  // round 1 after the last call at 31s
  auto out = keepAlive(s, {"a"}, sec(32), sec(40));
  CHECK(render(out) == Lines{interrupted("a", 1)});
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
  CHECK(render(out) == Lines{interrupted("a", 1)});
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
  auto out = s.workerFailed("a", 1, sec(2));
  CHECK(render(out) == Lines{ended("a", false), ended("b", false)});
  CHECK_THAT(textFor(out, "b"), Contains("max_restarts=0"));
  CHECK_THAT(textFor(out, "b"), Contains("node a"));
  CHECK(s.phase() == Phase::kClosed);
  CHECK(s.restartCount() == 0);
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

// ---- 9. interleavings -----------------------------------------------------------------------------

TEST_CASE("interleaving: a node dying during the last call cancels it, and the next join starts a new one",
          "[rendezvous]") {
  RendezvousState s("job", rules(2, 3), sec(0));
  CHECK(join(s, "a", sec(1)).empty());
  CHECK(join(s, "b", sec(2)).empty());  // last call until 32s
  auto quiet = keepAlive(s, {"a"}, sec(3), sec(31));
  CHECK(quiet.empty());                 // b dropped at 8s: nobody to tell while gathering
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
    CHECK(s.tick(sec(7) + kUs).empty());  // a last seen at 2s
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
  CHECK(s.tick(*s.nextDeadline()).empty());
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
