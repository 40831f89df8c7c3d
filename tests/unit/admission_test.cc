// Admission of a Join (rendezvous/rules/admission.h): the one path both backends use, so every
// rule here holds for a Join read from a gRPC stream and for one read from an etcd node key.
#include <catch2/catch.hpp>

#include <climits>
#include <variant>

#include "rendezvous/rules/admission.h"
#include "rendezvous/rules/rules_host.h"

using namespace ddprun;
using Catch::Matchers::Contains;

namespace {

JoinRequest goodJoin() {
  JoinRequest j;
  j.runId = "job";
  j.node.nodeId = "node-a";
  j.rules.minNodes = 1;
  j.rules.maxNodes = 2;
  j.node.host = "10.0.0.1";
  j.node.masterPort = 29500;
  return j;
}

JoinOrigin peer(const std::string& address) {
  JoinOrigin o;
  o.peerHost = address;
  return o;
}

std::string refusal(const JoinRequest& j, const JoinOrigin& origin = peer("10.0.0.1")) {
  auto out = admit(j, origin);
  REQUIRE(std::holds_alternative<Rejection>(out));
  const auto& r = std::get<Rejection>(out);
  CHECK(r.code == RejectCode::kMalformed);
  CHECK(r.fatal);
  return r.message;
}

}  // namespace

TEST_CASE("admission: a valid Join becomes the node the rules keep", "[rendezvous][admission]") {
  auto out = admit(goodJoin(), peer("10.0.0.1"));
  REQUIRE(std::holds_alternative<Admitted>(out));
  const auto& a = std::get<Admitted>(out);
  CHECK(a.node.nodeId == "node-a");
  CHECK(a.node.host == "10.0.0.1");
  CHECK(a.node.masterPort == 29500);
  CHECK(a.rules.maxNodes == 2);
  CHECK(a.warning.empty());
}

TEST_CASE("admission: ids, the host and the bounds are checked, and nothing refused is echoed", "[rendezvous][admission]") {
  JoinRequest j = goodJoin();
  j.node.nodeId = "x/evil";
  CHECK(refusal(j) == "invalid join: node id may hold only letters, digits and . _ : @ + = -");
  j = goodJoin();
  j.runId = std::string(300, 'r');
  CHECK_THAT(refusal(j), Contains("invalid join: run id is 300 bytes"));
  j = goodJoin();
  j.node.host = std::string(300, 'h');
  CHECK(refusal(j) == "invalid join: host is longer than 253 bytes");
  j = goodJoin();
  j.node.host = "bad host\n";
  CHECK_THAT(refusal(j), Contains("invalid join: host is not a hostname"));
  j = goodJoin();
  j.node.nodeRank = 2;  // max nodes 2: ranks 0 and 1
  CHECK_THAT(refusal(j), Contains("node rank (< max nodes)"));
  j = goodJoin();
  j.node.localWorldSize = 1025;
  CHECK_THAT(refusal(j), Contains("local world size (1-1024)"));
}

TEST_CASE("admission: rules out of range name the bound, 100000 nodes at most", "[rendezvous][admission]") {
  JoinRequest j = goodJoin();
  j.rules.maxNodes = INT_MAX;
  CHECK_THAT(refusal(j), Contains("1 <= min <= max <= 100000") && Contains("max 2147483647"));
  j = goodJoin();
  j.rules.minNodes = 0;
  CHECK_THAT(refusal(j), Contains("invalid job rules:"));
}

TEST_CASE("admission: the host against the peer address (gRPC)", "[rendezvous][admission]") {
  JoinRequest j = goodJoin();
  j.node.host = "";
  auto out = admit(j, peer("10.0.0.7"));
  REQUIRE(std::holds_alternative<Admitted>(out));
  CHECK(std::get<Admitted>(out).node.host == "10.0.0.7");  // as the server sees it

  j = goodJoin();
  out = admit(j, peer("10.0.0.7"));
  REQUIRE(std::holds_alternative<Admitted>(out));
  CHECK_THAT(std::get<Admitted>(out).warning, Contains("reports host 10.0.0.1 but connected from 10.0.0.7"));
  JoinOrigin strict = peer("10.0.0.7");
  strict.requireHostMatch = true;
  CHECK_THAT(refusal(j, strict), Contains("is not the address 10.0.0.7"));
}

TEST_CASE("admission: a node key on etcd (no peer address, the key names the node)", "[rendezvous][admission]") {
  JoinOrigin etcd;
  etcd.keyNodeId = "node-a";
  etcd.runId = "job";
  CHECK(std::holds_alternative<Admitted>(admit(goodJoin(), etcd)));
  JoinRequest j = goodJoin();
  j.node.host = "";
  CHECK_THAT(refusal(j, etcd), Contains("host is empty"));
  etcd.keyNodeId = "node-b";
  CHECK(refusal(goodJoin(), etcd) == "invalid join: node id is not the name of the node's key");
  etcd.keyNodeId = "node-a";
  etcd.runId = "other";
  CHECK(refusal(goodJoin(), etcd) == "invalid join: run id is not this job's");
}

TEST_CASE("rules host: other rules are refused naming the difference, effects name new rounds and the end",
          "[rendezvous][admission]") {
  using std::chrono::seconds;
  RendezvousRules rules;
  rules.minNodes = 1;
  rules.maxNodes = 1;
  RulesHost host("job", rules, Micros(0));
  auto admitted = std::get<Admitted>(admit(goodJoin(), peer("10.0.0.1")));  // max 2 here
  Effects refused = host.join(admitted, Micros(0));
  REQUIRE(refused.notices.size() == 1);
  REQUIRE(std::holds_alternative<Rejection>(refused.notices[0].body));
  CHECK(std::get<Rejection>(refused.notices[0].body).code == RejectCode::kRulesMismatch);
  CHECK_THAT(std::get<Rejection>(refused.notices[0].body).message, Contains("nnodes 1..2 here, 1..1 in the job"));

  admitted.rules = rules;
  Effects joined = host.join(admitted, Micros(0));
  CHECK(joined.roundsStarted == std::vector<uint64_t>{1});
  CHECK_FALSE(joined.jobEnded);
  Effects done = host.report("node-a", AgentReport::succeeded(1), Micros(1));
  CHECK(done.jobEnded);
  CHECK(done.roundsStarted.empty());
}

// The rules host decides once what the workers' store drops (both backends apply it): the etcd
// driver deleted only round N-1, the gRPC service never dropped a run at its end.
TEST_CASE("rules host: the store drops every round before a new one, and the whole run at the job's end",
          "[rendezvous]") {
  RendezvousRules rules;
  rules.minNodes = 1;
  rules.maxNodes = 3;
  rules.lastCallTimeout = Micros(0);
  RulesHost host("job", rules, Micros(0));
  auto joined = [&](const std::string& id) {
    Admitted a{goodJoin().node, rules, {}};
    a.node.nodeId = id;
    a.node.masterPort = 29500;
    return host.join(a, Micros(1));
  };
  Effects first = joined("a");
  first.append(host.tick(Micros(1)));  // min 1 and the last call over: round 1
  CHECK(first.storeDrops == StoreDrops{1, false});
  // Two joins in one batch (the etcd driver's): rounds 2 and 3 start, and the batch drops 1 and 2.
  Effects batch = joined("b");
  batch.append(joined("c"));
  CHECK(batch.roundsStarted == std::vector<uint64_t>{2, 3});
  CHECK(batch.storeDrops == StoreDrops{3, false});
  Effects quiet = host.report("a", AgentReport::heartbeat(3), Micros(2));
  CHECK_FALSE(quiet.storeDrops.any());
  host.report("a", AgentReport::succeeded(3), Micros(3));
  host.report("b", AgentReport::succeeded(3), Micros(3));
  Effects end = host.report("c", AgentReport::succeeded(3), Micros(3));
  CHECK(end.jobEnded);
  CHECK(end.storeDrops.run);
}
