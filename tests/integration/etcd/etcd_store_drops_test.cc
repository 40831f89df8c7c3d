// When the etcd driver drops the workers' store of a round (the rules host's Effects decide it for
// both backends): every round before a new one, and the whole run when the job ends. Driven
// through a real 3-member etcd cluster with node keys written by hand, so that two rounds start in
// one batch of the driver's. Before the drops were decided by the rules host, the driver deleted
// round N-1 only: round N-2's keys outlived a double round change until the job's lease ended.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "etcd/etcd_client.h"
#include "etcd_test_cluster.h"
#include "rendezvous/etcd/etcd_driver.h"
#include "rendezvous/wire/agent_proto.h"
#include "safety_bound.h"
#include "test_skip.h"

using ddprun::test::EtcdTestCluster;
using ddprun::test::kSafetyBound;
using namespace std::chrono_literals;
namespace pb = ddprun::v1;

namespace {

const std::string kJob = "/ddprun-drops/run/drops/";

ddprun::RendezvousRules oneToThree() {
  ddprun::RendezvousRules r;
  r.minNodes = 1;
  r.maxNodes = 3;
  r.joinTimeout = 60s;
  r.lastCallTimeout = 0s;
  r.heartbeatTimeout = 2s;
  return r;
}

// A node that does not report its workers stopped (an older agent): a round it is in restarts at
// once when another node joins, without waiting for a hand-over.
std::string joinOf(const std::string& nodeId) {
  ddprun::JoinRequest r;
  r.runId = "drops";
  r.node.nodeId = nodeId;
  r.rules = oneToThree();
  r.node.host = "127.0.0.1";
  pb::Join j;
  ddprun::toProto(r, &j);
  return j.SerializeAsString();
}

std::vector<std::string> keysUnder(ddprun::EtcdClient& client, const std::string& prefix) {
  std::vector<std::string> keys;
  for (const auto& kv : client.getPrefix(prefix)) keys.push_back(kv.key.substr(prefix.size()));
  return keys;
}

// Until `key` exists (or the bound passes).
bool waitKey(ddprun::EtcdClient& client, const std::string& key) {
  const auto deadline = std::chrono::steady_clock::now() + kSafetyBound;
  while (std::chrono::steady_clock::now() < deadline) {
    if (client.get(key)) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

}  // namespace

TEST_CASE("etcd driver: two rounds started in one batch drop every older round's store, and the job's end drops all",
          "[etcd][rendezvous]") {
  if (auto why = EtcdTestCluster::unavailableReason(); !why.empty()) DDPRUN_SKIP(why);
  EtcdTestCluster cluster;
  ddprun::EtcdClientOptions options;
  options.endpoints = cluster.endpoints();
  options.retryTimeout = kSafetyBound;
  ddprun::EtcdClient client(options);
  const int64_t jobLease = client.grantLease(30s);
  const int64_t nodeLease = client.grantLease(30s);
  client.put(kJob + "rdzv/driver", "driver", jobLease);  // this test's driver holds the key

  std::atomic<bool> stopping{false};
  ddprun::EtcdDriver driver(client, ddprun::EtcdDriverOptions{"drops", "driver", oneToThree(), "/ddprun-drops", jobLease, 2000ms},
                            stopping);
  std::thread driving([&] {
    try {
      driver.drive();
    } catch (const ddprun::Error&) {
      // The checks below say what went wrong.
    }
  });
  struct Stop {
    std::atomic<bool>& stopping;
    std::thread& driving;
    ~Stop() {
      stopping = true;
      driving.join();
    }
  } stop{stopping, driving};

  client.put(kJob + "rdzv/nodes/a", joinOf("a"), nodeLease);  // min 1: round 1 at once
  REQUIRE(waitKey(client, kJob + "round/1/alive"));
  client.put(kJob + "round/1/kv/nccl_id", "round 1's", jobLease);  // a worker's key of round 1

  // b and c in one transaction: one watch event batch, so rounds 2 and 3 start in one write.
  etcdserverpb::TxnRequest both;
  for (const std::string id : {"b", "c"}) {
    auto* put = both.add_success()->mutable_request_put();
    put->set_key(kJob + "rdzv/nodes/" + id);
    put->set_value(joinOf(id));
    put->set_lease(nodeLease);
  }
  REQUIRE(client.txn(both).succeeded());
  REQUIRE(waitKey(client, kJob + "round/3/alive"));
  CHECK(keysUnder(client, kJob + "round/") == std::vector<std::string>{"3/alive"});

  // Every member succeeds: the job ends, and the run's store goes with it.
  client.put(kJob + "round/3/kv/x", "round 3's", jobLease);
  for (const std::string id : {"a", "b", "c"}) {
    client.put(kJob + "rdzv/events/" + id + "/00000000000000000001",
               ddprun::toProto(ddprun::AgentReport::succeeded(3)).SerializeAsString(), nodeLease);
  }
  const auto deadline = std::chrono::steady_clock::now() + kSafetyBound;
  while (!keysUnder(client, kJob + "round/").empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  CHECK(keysUnder(client, kJob + "round/").empty());
}
