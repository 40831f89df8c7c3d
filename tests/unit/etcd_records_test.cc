// The etcd rendezvous' records (rendezvous/etcd/etcd_records.h): a snapshot survives its wire form
// exactly, and a state restored from it answers as the original; rules and notices keep their
// fields.
#include "rendezvous/etcd/etcd_records.h"
#include "rendezvous/wire/notice_proto.h"

#include "state_machine_test_util.h"

using namespace ddprun::state_machine_test;
namespace rec = ddprun::etcd_records;

TEST_CASE("etcd records: a snapshot through its wire form restores a state that answers as the original", "[rendezvous][snapshot]") {
  auto r = rules(2, 3, /*maxRestarts=*/2);
  r.heartbeatTimeout = sec(120);
  RendezvousState s("job", r, sec(0));
  join(s, "a", sec(1), 2);
  join(s, "b", sec(1), 1, -1);
  join(s, "c", sec(1));
  s.workerFailed("c", 1, sec(2));
  s.succeeded("a", 2, sec(3));
  auto wire = rec::toProto(s.snapshot(sec(4)), 77);
  std::string bytes = wire.SerializeAsString();
  ddprun::v1::RendezvousSnapshot back;
  REQUIRE(back.ParseFromString(bytes));
  CHECK(back.notice_seq() == 77);
  RendezvousState twin = RendezvousState::restore(rec::fromProto(back), sec(1000));
  CHECK(twin.rules() == s.rules());
  CHECK(twin.round() == s.round());
  CHECK(twin.restartCount() == s.restartCount());
  CHECK(twin.members() == s.members());
  CHECK(render(twin.succeeded("b", 2, sec(1001)), true) == render(s.succeeded("b", 2, sec(5)), true));
  CHECK(render(twin.succeeded("c", 2, sec(1002)), true) == render(s.succeeded("c", 2, sec(6)), true));
  CHECK(twin.phase() == Phase::kClosed);
}

TEST_CASE("etcd records: rules go as milliseconds, notices carry the round's store prefix and reject codes", "[rendezvous]") {
  auto r = rules(1, 4, 3);
  ddprun::v1::JobRules m;
  ddprun::toProto(r, &m);
  CHECK(ddprun::fromProto(m) == r);
  RoundAssignment a;
  a.round = 5;
  a.groupRank = 1;
  auto msg = ddprun::toProto("job42", Notice{"a", a}, ddprun::Liveness::kLease);
  CHECK(msg.round_assigned().store_prefix() == "/run/job42/round/5/");
  CHECK(msg.round_assigned().group_rank() == 1);
  auto rej = ddprun::toProto("job42", Notice{"a", Rejection{RejectCode::kRulesMismatch, "other settings", true}}, ddprun::Liveness::kLease);
  CHECK(rej.rejected().code() == ddprun::v1::Rejected::RULES_MISMATCH);
  CHECK(rej.rejected().fatal());
}

TEST_CASE("etcd records: excluded hosts and failure counts survive the snapshot's wire form", "[rendezvous][snapshot]") {
  auto r = rules(2, 2, 5);
  r.excludeNodeAfter = 2;
  RendezvousState s("job", r, sec(0));
  join(s, "a", sec(1));
  join(s, "b", sec(1));
  join(s, "c", sec(1));
  s.workerFailed("a", 1, sec(2));  // host-a: 1 failure
  s.workerFailed("b", 2, sec(3));  // host-b: 1
  s.workerFailed("b", 3, sec(4));  // host-b: 2, excluded
  REQUIRE_FALSE(s.hasNode("b"));
  ddprun::v1::RendezvousSnapshot back;
  REQUIRE(back.ParseFromString(rec::toProto(s.snapshot(sec(5)), 1).SerializeAsString()));
  auto snap = rec::fromProto(back);
  CHECK(snap.job.rules.excludeNodeAfter == 2);
  CHECK(snap.job.excludedHosts == std::set<std::string>{"host-b"});
  CHECK(snap.job.hostFailures == std::map<std::string, int>{{"host-a", 1}, {"host-b", 2}});
  RendezvousState twin = RendezvousState::restore(snap, sec(0));
  auto out = twin.workerFailed("a", twin.round(), sec(1));  // host-a's second: excluded on the successor too
  CHECK_FALSE(twin.hasNode("a"));
}

TEST_CASE("etcd records: that the round's first finish was told survives the snapshot's wire form", "[rendezvous][snapshot]") {
  auto r = rules(2, 2);
  r.heartbeatTimeout = sec(120);
  RendezvousState s("job", r, sec(0));
  join(s, "a", sec(1));
  join(s, "b", sec(1));
  REQUIRE(s.rankFinished("a", 1, 0, sec(2)).size() == 1);
  ddprun::v1::RendezvousSnapshot back;
  REQUIRE(back.ParseFromString(rec::toProto(s.snapshot(sec(3)), 1).SerializeAsString()));
  RendezvousState twin = RendezvousState::restore(rec::fromProto(back), sec(0));
  CHECK(twin.rankFinished("b", 1, 1, sec(1)).empty());  // not told to a a second time
}

TEST_CASE("etcd records: every field of a snapshot survives its wire form", "[rendezvous][snapshot]") {
  const RendezvousState::Snapshot s = everyFieldSet();
  ddprun::v1::RendezvousSnapshot back;
  REQUIRE(back.ParseFromString(rec::toProto(s, 5).SerializeAsString()));
  CHECK(rec::fromProto(back) == s);
}
