// The workers' store on etcd (worker_sdk/etcd_store.h over store/etcd/etcd_key_store.h) against a real 3-member etcd cluster.
#include <catch2/catch.hpp>

#include <atomic>
#include <future>
#include <set>
#include <thread>

#include <unistd.h>

#include "common/error.h"
#include "etcd_test_cluster.h"
#include "etcd/etcd_client.h"
#include "safety_bound.h"
#include "test_skip.h"
#include "worker_sdk/env.h"
#include "worker_sdk/etcd_store.h"
#include "worker_sdk/remote_store.h"

using ddprun::test::EtcdTestCluster;
using ddprun::test::kSafetyBound;

namespace {

ddp::EtcdStoreOptions storeOptions(const EtcdTestCluster& cluster, int first = -1) {
  ddp::EtcdStoreOptions o;
  o.client.endpoints = cluster.endpoints();
  o.client.firstEndpoint = first;
  o.client.callTimeout = std::chrono::seconds(1);
  o.client.retryTimeout = kSafetyBound;
  o.prefix = "/ddprun/run/job42/round/1/";
  o.timeout = kSafetyBound;
  return o;
}

}  // namespace

TEST_CASE("etcd store: set, get, check, delete, numKeys, and a wait that times out names the key", "[etcd][store]") {
  if (auto why = EtcdTestCluster::unavailableReason(); !why.empty()) DDPRUN_SKIP(why);
  EtcdTestCluster cluster;
  ddp::EtcdStore store(storeOptions(cluster));
  store.set("a", "1");
  store.set("b", std::string("\0bin\xff", 5));
  CHECK(store.get("a") == "1");
  CHECK(store.get("b") == std::string("\0bin\xff", 5));
  CHECK(store.check({"a", "b"}));
  CHECK_FALSE(store.check({"a", "missing"}));
  CHECK(store.numKeys() == 2);
  CHECK(store.deleteKey("a"));
  CHECK_FALSE(store.deleteKey("a"));
  CHECK(store.numKeys() == 1);
  CHECK_THROWS_WITH(store.wait({"b", "never"}, std::chrono::milliseconds(200)),
                    Catch::Contains("never") && !Catch::Contains("b,"));
  CHECK_THROWS_AS(store.set("", "x"), ddprun::ConfigError);
  store.set("word", "abc");
  CHECK_THROWS_AS(store.add("word", 1), ddprun::StateError);
  // Another round's store shares nothing with this one.
  auto other = storeOptions(cluster);
  other.prefix = "/ddprun/run/job42/round/2/";
  ddp::EtcdStore next(other);
  CHECK(next.numKeys() == 0);
  CHECK_FALSE(next.check({"b"}));
}

TEST_CASE("etcd store: N clients adding at once give the exact sum, each value once", "[etcd][store]") {
  if (auto why = EtcdTestCluster::unavailableReason(); !why.empty()) DDPRUN_SKIP(why);
  EtcdTestCluster cluster;
  constexpr int kClients = 8, kAdds = 25;
  std::vector<std::future<std::vector<int64_t>>> results;
  for (int c = 0; c < kClients; ++c) {
    results.push_back(std::async(std::launch::async, [&cluster, c] {
      ddp::EtcdStore store(storeOptions(cluster, c % 3));
      std::vector<int64_t> seen;
      for (int i = 0; i < kAdds; ++i) seen.push_back(store.add("counter", 1));
      return seen;
    }));
  }
  std::set<int64_t> all;
  for (auto& r : results) {
    for (int64_t v : r.get()) all.insert(v);
  }
  // Every add returned a value no other add returned, and together they are 1..N exactly.
  CHECK(all.size() == static_cast<std::size_t>(kClients * kAdds));
  CHECK(*all.begin() == 1);
  CHECK(*all.rbegin() == kClients * kAdds);
  ddp::EtcdStore store(storeOptions(cluster));
  CHECK(store.get("counter") == std::to_string(kClients * kAdds));
  CHECK(store.add("counter", -5) == kClients * kAdds - 5);
}

TEST_CASE("etcd store: of N racing compare_set calls on a missing key, exactly one wins", "[etcd][store]") {
  if (auto why = EtcdTestCluster::unavailableReason(); !why.empty()) DDPRUN_SKIP(why);
  EtcdTestCluster cluster;
  constexpr int kClients = 8;
  std::vector<std::future<std::string>> results;
  for (int c = 0; c < kClients; ++c) {
    results.push_back(std::async(std::launch::async, [&cluster, c] {
      ddp::EtcdStore store(storeOptions(cluster, c % 3));
      return store.compareSet("owner", "", "client-" + std::to_string(c));
    }));
  }
  std::set<std::string> answers;
  int winners = 0;
  for (int c = 0; c < kClients; ++c) {
    std::string got = results[c].get();
    answers.insert(got);
    winners += got == "client-" + std::to_string(c);
  }
  CHECK(winners == 1);
  CHECK(answers.size() == 1);  // every loser was told the winner's value
  ddp::EtcdStore store(storeOptions(cluster));
  CHECK(store.compareSet("owner", *answers.begin(), "next") == "next");
  CHECK(store.compareSet("owner", "wrong", "never") == "next");
}

TEST_CASE("etcd store: a wait is released by a set from another client", "[etcd][store]") {
  if (auto why = EtcdTestCluster::unavailableReason(); !why.empty()) DDPRUN_SKIP(why);
  EtcdTestCluster cluster;
  ddp::EtcdStore waiter(storeOptions(cluster, 0));
  ddp::EtcdStore setter(storeOptions(cluster, 1));
  auto got = std::async(std::launch::async, [&] { return waiter.get("nccl_id"); });
  setter.set("other", "x");
  setter.set("nccl_id", "0123");
  CHECK(got.get() == "0123");
}

TEST_CASE("etcd store: a wait survives the loss of the etcd leader it waits on", "[etcd][store]") {
  if (auto why = EtcdTestCluster::unavailableReason(); !why.empty()) DDPRUN_SKIP(why);
  EtcdTestCluster cluster;
  std::size_t leader = cluster.leader();
  ddp::EtcdStore waiter(storeOptions(cluster, static_cast<int>(leader)));
  std::atomic<bool> released{false};
  auto done = std::async(std::launch::async, [&] {
    waiter.wait({"k1", "k2"});
    released = true;
  });
  ddp::EtcdStore setter(storeOptions(cluster, static_cast<int>((leader + 1) % 3)));
  setter.set("k1", "before");  // seen on the leader's watch (or read, if the watch came later)
  cluster.kill(leader);
  setter.set("k2", "after");   // only a watch resumed on another member sees this one
  done.get();
  CHECK(released);
}

TEST_CASE("etcd store: a wait goes on when its watch resumes past a compaction", "[etcd][store]") {
  // The waiter's member freezes; meanwhile the key is set and the cluster compacted, so the watch
  // cannot resume where it was on another member (etcd says "compacted"). The wait reads again
  // and is released; it failed with "revision N was compacted" before.
  if (auto why = EtcdTestCluster::unavailableReason(); !why.empty()) DDPRUN_SKIP(why);
  if (access("/usr/bin/etcdctl", X_OK) != 0) DDPRUN_SKIP("needs etcdctl (apt-get install etcd-client)");
  EtcdTestCluster cluster;
  std::size_t leader = cluster.leader();
  std::size_t frozen = (leader + 1) % 3;
  ddp::EtcdStore waiter(storeOptions(cluster, static_cast<int>(frozen)));
  auto done = std::async(std::launch::async, [&] { waiter.wait({"k1"}); });
  // The wait reads, then watches: give it time to be watching on the member about to freeze.
  CHECK(done.wait_for(std::chrono::milliseconds(500)) == std::future_status::timeout);
  cluster.stop(frozen);
  ddp::EtcdStore setter(storeOptions(cluster, static_cast<int>(leader)));
  setter.set("other", "x");
  setter.set("k1", "v");
  ddprun::EtcdClientOptions o;
  o.endpoints = cluster.endpoints();
  o.firstEndpoint = static_cast<int>(leader);
  ddprun::EtcdClient writer(o);
  cluster.compact(writer.put("/elsewhere", "advance"));
  done.get();  // throws what the wait threw
  cluster.cont(frozen);
  CHECK(waiter.get("k1") == "v");
}

TEST_CASE("etcd store: makeStore picks the etcd store from DDPRUN_STORE_ADDR=etcd://", "[etcd][store]") {
  if (auto why = EtcdTestCluster::unavailableReason(); !why.empty()) DDPRUN_SKIP(why);
  EtcdTestCluster cluster;
  std::map<std::string, std::string> vars = {
      {"RANK", "0"}, {"LOCAL_RANK", "0"}, {"WORLD_SIZE", "1"}, {"LOCAL_WORLD_SIZE", "1"},
      {"GROUP_RANK", "0"}, {"GROUP_WORLD_SIZE", "1"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"},
      {"TORCHELASTIC_RUN_ID", "job7"}, {"DDPRUN_ROUND", "3"}, {"DDPRUN_ETCD_PREFIX", "/mytest"},
      {"DDPRUN_STORE_ADDR", "etcd://" + cluster.endpointList()}};
  auto env = ddp::Env::fromEnvironment(vars);
  CHECK(ddp::etcdStoreOptions(env).prefix == "/mytest/run/job7/round/3/");
  auto store = ddp::makeStore(env, kSafetyBound);
  REQUIRE(dynamic_cast<ddp::EtcdStore*>(store.get()) != nullptr);
  ddprun::EtcdClientOptions o;
  o.endpoints = cluster.endpoints();
  ddprun::EtcdClient raw(o);
  // Fenced by round: nothing is written before the driver's round marker exists.
  CHECK_THROWS_WITH(store->set("k", "v"), Catch::Contains("stale round"));
  raw.put("/mytest/run/job7/round/3/alive", "");
  store->set("k", "v");
  CHECK(raw.get("/mytest/run/job7/round/3/kv/k")->value == "v");
}

TEST_CASE("etcd store: when the round's marker goes, writes are refused and a pending wait fails at once", "[etcd][store]") {
  if (auto why = EtcdTestCluster::unavailableReason(); !why.empty()) DDPRUN_SKIP(why);
  EtcdTestCluster cluster;
  auto o = storeOptions(cluster);
  o.fenceByRound = true;
  o.timeout = std::chrono::minutes(10);  // far beyond the safety bound: only the fence can end the wait
  ddprun::EtcdClientOptions co;
  co.endpoints = cluster.endpoints();
  ddprun::EtcdClient raw(co);
  raw.put(o.prefix + "alive", "");
  ddp::EtcdStore store(o);
  store.set("a", "1");
  CHECK(store.add("n", 2) == 2);
  CHECK(store.compareSet("c", "", "x") == "x");
  auto pending = std::async(std::launch::async, [&] {
    try {
      store.wait({"never"});
      return std::string("released");
    } catch (const ddprun::StateError& e) {
      return std::string(e.what());
    }
  });
  raw.deletePrefix(o.prefix);  // the next round started: the driver dropped this round's keys
  REQUIRE(pending.wait_for(kSafetyBound) == std::future_status::ready);
  CHECK_THAT(pending.get(), Catch::Contains("stale round"));
  CHECK_THROWS_WITH(store.set("a", "2"), Catch::Contains("stale round"));
  CHECK_THROWS_WITH(store.add("n", 1), Catch::Contains("stale round"));
  CHECK_THROWS_WITH(store.compareSet("c", "x", "y"), Catch::Contains("stale round"));
  CHECK_THROWS_WITH(store.get("a"), Catch::Contains("stale round"));
  CHECK(raw.countPrefix(o.prefix) == 0);  // nothing written behind the fence
}
