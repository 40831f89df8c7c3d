// The etcd backend's admission against a real 3-member etcd cluster: a Join written straight into
// etcd (a hand-made client, not an agent) gets what the daemon would give the same Join, through
// the one admission path (rendezvous/rules/admission.h). Both cases failed before that path was
// shared: etcd dropped last_round and checked nothing.
#include <catch2/catch.hpp>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/exit_codes.h"
#include "ddprun/v1/rendezvous.grpc.pb.h"
#include "etcd/etcd_client.h"
#include "etcd_test_cluster.h"
#include "rendezvous/etcd/etcd_rendezvous.h"
#include "rendezvous/server/rendezvous_server.h"
#include "rendezvous/wire/agent_proto.h"
#include "rendezvous/wire/notice_proto.h"
#include "safety_bound.h"
#include "test_skip.h"

using ddprun::test::EtcdTestCluster;
using ddprun::test::kSafetyBound;
using namespace std::chrono_literals;
namespace pb = ddprun::v1;

namespace {

const std::string kPrefix = "/ddprun-admission";

// Records what the agent's rendezvous tells it.
struct Recorder final : ddprun::RendezvousListener {
  std::mutex mu;
  std::vector<ddprun::RoundInfo> rounds;
  std::optional<ddprun::JobClosure> closed;
  void onRoundReady(const ddprun::RoundInfo& r) override {
    std::lock_guard<std::mutex> lock(mu);
    rounds.push_back(r);
  }
  void onRoundInterrupted(uint64_t, const std::string&) override {}
  void onJobClosed(const ddprun::JobClosure& c) override {
    std::lock_guard<std::mutex> lock(mu);
    closed = c;
  }
  std::vector<ddprun::RoundInfo> roundsSoFar() {
    std::lock_guard<std::mutex> lock(mu);
    return rounds;
  }
};

ddprun::RendezvousRules twoNodes() {
  ddprun::RendezvousRules r;
  r.minNodes = 2;
  r.maxNodes = 2;
  r.joinTimeout = 60s;
  r.lastCallTimeout = 0s;
  r.heartbeatTimeout = 2s;
  return r;
}

ddprun::EtcdRendezvousOptions agentOptions(const EtcdTestCluster& cluster, const std::string& runId,
                                           const std::string& nodeId) {
  ddprun::EtcdRendezvousOptions o;
  o.client.endpoints = cluster.endpoints();
  o.client.callTimeout = 1s;
  o.client.retryTimeout = kSafetyBound;
  o.prefix = kPrefix;
  o.runId = runId;
  o.nodeId = nodeId;
  o.rules = twoNodes();
  o.host = "127.0.0.1";
  return o;
}

pb::Join joinOf(const std::string& runId, const std::string& nodeId) {
  ddprun::JoinRequest r;
  r.runId = runId;
  r.node.nodeId = nodeId;
  r.rules = twoNodes();
  r.node.host = "127.0.0.1";
  r.node.reportsStopped = true;
  pb::Join j;
  ddprun::toProto(r, &j);
  return j;
}

// What a ddprun-rdzv on loopback answers to the same Join (the reference for the etcd backend).
pb::Rejected daemonRefusal(const pb::Join& join) {
  ddprun::RendezvousServerOptions o;
  o.port = 0;
  ddprun::RendezvousServer server(o);
  auto stub = pb::Rendezvous::NewStub(grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kSafetyBound);
  auto stream = stub->Session(&context);
  pb::AgentMessage msg;
  *msg.mutable_join() = join;
  REQUIRE(stream->Write(msg));
  pb::ServerMessage reply;
  REQUIRE(stream->Read(&reply));
  REQUIRE(reply.has_rejected());
  stream->WritesDone();
  stream->Finish();
  return reply.rejected();
}

// The notices the driver wrote for `nodeId`, once there is one (or none within the bound).
std::vector<pb::ServerMessage> noticesFor(ddprun::EtcdClient& client, const std::string& runId, const std::string& nodeId,
                                          std::chrono::milliseconds within) {
  const std::string prefix = kPrefix + "/run/" + runId + "/rdzv/notices/" + nodeId + "/";
  const auto deadline = std::chrono::steady_clock::now() + within;
  for (;;) {
    auto kvs = client.getPrefix(prefix);
    if (!kvs.empty() || std::chrono::steady_clock::now() > deadline) {
      std::vector<pb::ServerMessage> out;
      for (const auto& kv : kvs) {
        pb::ServerMessage m;
        REQUIRE(m.ParseFromString(kv.value));
        out.push_back(m);
      }
      return out;
    }
    std::this_thread::sleep_for(20ms);
  }
}

// A node key written by hand, on a lease of its own.
void putNodeKey(ddprun::EtcdClient& client, const std::string& runId, const std::string& keyName, const pb::Join& join) {
  int64_t lease = client.grantLease(10s);
  client.put(kPrefix + "/run/" + runId + "/rdzv/nodes/" + keyName, join.SerializeAsString(), lease);
}

// A hand-made client: it writes node keys as no agent would.
ddprun::EtcdClientOptions clientOptions(const EtcdTestCluster& cluster) {
  ddprun::EtcdClientOptions o;
  o.endpoints = cluster.endpoints();
  o.retryTimeout = kSafetyBound;
  return o;
}

struct Job {
  explicit Job(const EtcdTestCluster& cluster, const std::string& runId)
      : driver(ddprun::makeEtcdRendezvous(agentOptions(cluster, runId, "a"), [](std::function<void()> f) { f(); })) {
    driver->join(&recorder);
  }
  Recorder recorder;
  std::unique_ptr<ddprun::Rendezvous> driver;  // the only agent: it drives
};

}  // namespace

TEST_CASE("etcd rendezvous: a Join with a last_round the job never had is refused with STALE_ROUND (exit 200)",
          "[etcd][rendezvous]") {
  if (auto why = EtcdTestCluster::unavailableReason(); !why.empty()) DDPRUN_SKIP(why);
  EtcdTestCluster cluster;
  ddprun::EtcdClient client(clientOptions(cluster));
  Job job(cluster, "stale");

  pb::Join join = joinOf("stale", "b");
  join.set_last_round(7);
  join.set_has_last_round(true);
  putNodeKey(client, "stale", "b", join);

  auto notices = noticesFor(client, "stale", "b", kSafetyBound);
  REQUIRE(notices.size() == 1);
  REQUIRE(notices[0].has_rejected());
  CHECK(notices[0].rejected().code() == pb::Rejected::STALE_ROUND);
  CHECK(notices[0].rejected().fatal());
  CHECK(ddprun::exitStatusOfRefusal(notices[0].rejected().code()) == ddprun::kExitInfrastructure);
  // The daemon refuses the same Join of a job at round 0 the same way.
  pb::Rejected daemon = daemonRefusal(join);
  CHECK(daemon.code() == pb::Rejected::STALE_ROUND);
  // Refused, it holds no place: the job still waits for a second node.
  std::this_thread::sleep_for(300ms);
  CHECK(job.recorder.roundsSoFar().empty());
}

TEST_CASE("etcd rendezvous: a malformed Join written into etcd gets the daemon's refusal, and no worker sees its host",
          "[etcd][rendezvous]") {
  if (auto why = EtcdTestCluster::unavailableReason(); !why.empty()) DDPRUN_SKIP(why);
  EtcdTestCluster cluster;
  ddprun::EtcdClient client(clientOptions(cluster));
  Job job(cluster, "bad");

  struct Case {
    std::string name;
    pb::Join join;
  };
  std::vector<Case> cases;
  {
    pb::Join j = joinOf("bad", "longhost");
    j.set_host(std::string(300, 'h'));
    cases.push_back({"a 300-byte host", j});
  }
  {
    pb::Join j = joinOf("bad", "norules");
    j.mutable_rules()->set_min_nodes(0);
    cases.push_back({"min nodes 0", j});
  }
  {
    pb::Join j = joinOf("bad", "toomany");
    j.mutable_rules()->set_max_nodes(100001);
    cases.push_back({"max nodes past 100000", j});
  }
  {
    pb::Join j = joinOf("bad", "bigrank");
    j.set_node_rank(5);
    cases.push_back({"a node rank past max nodes", j});
  }
  for (const auto& c : cases) {
    SECTION(c.name) {
      putNodeKey(client, "bad", c.join.node_id(), c.join);
      auto notices = noticesFor(client, "bad", c.join.node_id(), kSafetyBound);
      REQUIRE(notices.size() == 1);
      REQUIRE(notices[0].has_rejected());
      pb::Rejected daemon = daemonRefusal(c.join);
      CHECK(notices[0].rejected().code() == daemon.code());
      CHECK(notices[0].rejected().code() == pb::Rejected::MALFORMED);
      CHECK(notices[0].rejected().message() == daemon.message());
      CHECK(ddprun::exitStatusOfRefusal(notices[0].rejected().code()) == ddprun::kExitUsage);
    }
  }
  SECTION("a key name that is not a node id (x/evil) gets no notice under another node's prefix") {
    pb::Join j = joinOf("bad", "x/evil");
    putNodeKey(client, "bad", "x/evil", j);
    // And a key whose name is not the Join's node id is refused to the key's name.
    pb::Join other = joinOf("bad", "someone-else");
    putNodeKey(client, "bad", "y", other);
    auto refused = noticesFor(client, "bad", "y", kSafetyBound);
    REQUIRE(refused.size() == 1);
    REQUIRE(refused[0].has_rejected());
    CHECK(refused[0].rejected().code() == pb::Rejected::MALFORMED);
    CHECK(refused[0].rejected().message() == "invalid join: node id is not the name of the node's key");
    // The driver has read both keys by now (etcd orders the puts): nothing under x/.
    CHECK(noticesFor(client, "bad", "x", 0ms).empty());
    CHECK(noticesFor(client, "bad", "x/evil", 0ms).empty());
  }
  // Whatever was refused, the job forms with a real second node only, and MASTER_ADDR is a real
  // node's address.
  Recorder second;
  auto b = ddprun::makeEtcdRendezvous(agentOptions(cluster, "bad", "b"), [](std::function<void()> f) { f(); });
  b->join(&second);
  const auto deadline = std::chrono::steady_clock::now() + kSafetyBound;
  while (second.roundsSoFar().empty() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(20ms);
  auto rounds = second.roundsSoFar();
  REQUIRE(rounds.size() == 1);
  CHECK(rounds[0].groupWorldSize == 2);
  CHECK(rounds[0].masterAddr == "127.0.0.1");
}
