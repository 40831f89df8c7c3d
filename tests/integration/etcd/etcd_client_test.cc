// EtcdClient and EtcdWatch against a real 3-member etcd 3.4 cluster (etcd_test_cluster.h).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <chrono>

#include "etcd_test_cluster.h"
#include "safety_bound.h"
#include "common/error.h"
#include "etcd/etcd_client.h"
#include "etcd/etcd_watch.h"
#include "test_skip.h"

using namespace ddprun;
using ddprun::test::EtcdTestCluster;
using ddprun::test::kSafetyBound;

namespace {

EtcdClientOptions optionsFor(const EtcdTestCluster& cluster, int first = -1) {
  EtcdClientOptions o;
  o.endpoints = cluster.endpoints();
  o.firstEndpoint = first;
  o.callTimeout = std::chrono::seconds(1);  // a frozen member costs one such attempt
  o.retryTimeout = kSafetyBound;
  return o;
}

// The events of `watch` until `match` accepts one; fails at the safety bound.
template <class Match>
mvccpb::Event awaitEvent(EtcdWatch& watch, Match match) {
  const auto deadline = std::chrono::steady_clock::now() + kSafetyBound;
  while (std::chrono::steady_clock::now() < deadline) {
    for (auto& ev : watch.next(deadline)) {
      if (match(ev)) return ev;
    }
  }
  FAIL("no matching watch event within the safety bound");
  return {};
}

}  // namespace

TEST_CASE("etcd client: put, get, and a transaction that compares the mod revision", "[etcd]") {
  if (auto why = EtcdTestCluster::unavailableReason(); !why.empty()) DDPRUN_SKIP(why);
  EtcdTestCluster cluster;
  EtcdClient client(optionsFor(cluster));
  int64_t rev = client.put("/t/k", "v1");
  auto kv = client.get("/t/k");
  REQUIRE(kv);
  CHECK(kv->value == "v1");
  CHECK(kv->modRevision == rev);
  CHECK_FALSE(client.get("/t/missing"));

  auto cas = [&](int64_t expectRev, const std::string& value) {
    etcdserverpb::TxnRequest t;
    auto* cmp = t.add_compare();
    cmp->set_key("/t/k");
    cmp->set_target(etcdserverpb::Compare::MOD);
    cmp->set_result(etcdserverpb::Compare::EQUAL);
    cmp->set_mod_revision(expectRev);
    auto* put = t.add_success()->mutable_request_put();
    put->set_key("/t/k");
    put->set_value(value);
    return client.txn(t).succeeded();
  };
  CHECK(cas(rev, "v2"));
  CHECK_FALSE(cas(rev, "v3"));  // the revision moved on: the second writer loses
  CHECK(client.get("/t/k")->value == "v2");

  client.put("/t/p/a", "1");
  client.put("/t/p/b", "2");
  CHECK(client.countPrefix("/t/p/") == 2);
  CHECK(client.getPrefix("/t/p/").size() == 2);
  CHECK(client.deletePrefix("/t/") == 3);
  CHECK(client.countPrefix("/t/") == 0);
}

TEST_CASE("etcd client: a watch sees a put made by another client", "[etcd]") {
  if (auto why = EtcdTestCluster::unavailableReason(); !why.empty()) DDPRUN_SKIP(why);
  EtcdTestCluster cluster;
  EtcdClient watcher(optionsFor(cluster, 0));
  EtcdClient writer(optionsFor(cluster, 1));
  int64_t rev = 0;
  CHECK_FALSE(watcher.get("/w/key", &rev));
  EtcdWatch watch(watcher, "/w/", etcdPrefixEnd("/w/"), rev);
  writer.put("/w/key", "hello");
  auto ev = awaitEvent(watch, [](const mvccpb::Event& e) { return e.kv().key() == "/w/key"; });
  CHECK(ev.type() == mvccpb::Event::PUT);
  CHECK(ev.kv().value() == "hello");
}

TEST_CASE("etcd client: a watch from now, and a read at the revision it starts after, see every change once", "[etcd]") {
  if (auto why = EtcdTestCluster::unavailableReason(); !why.empty()) DDPRUN_SKIP(why);
  EtcdTestCluster cluster;
  EtcdClient watcher(optionsFor(cluster, 0));
  EtcdClient writer(optionsFor(cluster, 1));
  int64_t before = writer.put("/n/a", "1");
  EtcdWatch watch(watcher, "/n/", etcdPrefixEnd("/n/"), EtcdWatch::kFromNow);
  auto from = watch.startedAfter(std::chrono::steady_clock::now() + kSafetyBound);
  REQUIRE(from.has_value());
  CHECK(*from >= before);
  int64_t after = writer.put("/n/b", "2");
  CHECK(after > *from);
  // The read at the watch's start holds what came before it, the watch what came after.
  auto keys = watcher.getPrefix("/n/", nullptr, *from);
  REQUIRE(keys.size() == 1);
  CHECK(keys[0].key == "/n/a");
  auto ev = awaitEvent(watch, [](const mvccpb::Event&) { return true; });
  CHECK(ev.kv().key() == "/n/b");
  CHECK(ev.kv().mod_revision() == after);
  // A read at an older revision does not see later keys.
  CHECK(watcher.getPrefix("/n/", nullptr, before - 1).empty());
}

TEST_CASE("etcd client: an expired lease removes its keys (seen by a watch)", "[etcd]") {
  if (auto why = EtcdTestCluster::unavailableReason(); !why.empty()) DDPRUN_SKIP(why);
  EtcdTestCluster cluster;
  EtcdClient client(optionsFor(cluster));
  int64_t lease = client.grantLease(std::chrono::seconds(1));
  int64_t rev = client.put("/l/node", "alive", lease);
  CHECK(client.keepAliveOnce(lease) > 0);
  EtcdWatch watch(client, "/l/node", "", rev);
  // Nobody renews the lease: etcd deletes the key when it expires.
  auto ev = awaitEvent(watch, [](const mvccpb::Event& e) { return e.type() == mvccpb::Event::DELETE; });
  CHECK(ev.kv().key() == "/l/node");
  CHECK_FALSE(client.get("/l/node"));
  CHECK(client.keepAliveOnce(lease) == 0);  // the lease is gone
  client.revokeLease(lease);                // revoking a gone lease is not an error
}

TEST_CASE("etcd client: calls go on after the leader is killed (failover to another member)", "[etcd]") {
  if (auto why = EtcdTestCluster::unavailableReason(); !why.empty()) DDPRUN_SKIP(why);
  EtcdTestCluster cluster;
  std::size_t leader = cluster.leader();
  EtcdClient client(optionsFor(cluster, static_cast<int>(leader)));  // starts on the leader
  client.put("/f/before", "1");
  EtcdClient watcher(optionsFor(cluster, static_cast<int>(leader)));
  int64_t rev = 0;
  watcher.get("/f/after", &rev);
  EtcdWatch watch(watcher, "/f/after", "", rev);
  cluster.kill(leader);
  client.put("/f/after", "2");
  CHECK(client.get("/f/before")->value == "1");
  CHECK(client.currentEndpoint() != leader);
  // The watch was on the killed member too: it resumed elsewhere and saw the put.
  auto ev = awaitEvent(watch, [](const mvccpb::Event& e) { return e.type() == mvccpb::Event::PUT; });
  CHECK(ev.kv().value() == "2");
}

TEST_CASE("etcd client: calls go on while the leader is frozen (SIGSTOP)", "[etcd]") {
  if (auto why = EtcdTestCluster::unavailableReason(); !why.empty()) DDPRUN_SKIP(why);
  EtcdTestCluster cluster;
  std::size_t leader = cluster.leader();
  EtcdClient client(optionsFor(cluster, static_cast<int>(leader)));
  client.put("/s/before", "1");
  cluster.stop(leader);  // accepts connections, answers nothing: only the call deadline tells
  client.put("/s/after", "2");
  CHECK(client.get("/s/after")->value == "2");
  CHECK(client.currentEndpoint() != leader);
  cluster.cont(leader);
}

TEST_CASE("etcd client: with etcd auth on, a user and password work, a wrong password is a config error", "[etcd]") {
  if (auto why = EtcdTestCluster::unavailableReason(); !why.empty()) DDPRUN_SKIP(why);
  if (access("/usr/bin/etcdctl", X_OK) != 0) DDPRUN_SKIP("needs etcdctl (apt-get install etcd-client)");
  EtcdTestCluster cluster;
  cluster.enableAuth("trainer", "test-only-pw");
  auto o = optionsFor(cluster);
  o.user = "trainer";
  o.password = "test-only-pw";
  EtcdClient client(o);
  client.put("/a/k", "v");
  CHECK(client.get("/a/k")->value == "v");
  EtcdClient anonymous(optionsFor(cluster));
  CHECK_THROWS_AS(anonymous.put("/a/k", "x"), ddprun::Error);  // refused: no user
  o.password = "wrong";
  CHECK_THROWS_AS(EtcdClient(o), ddprun::ConfigError);
}

TEST_CASE("etcd client: a lease keepalive moves to another member after the leader is killed", "[etcd]") {
  // Found by test_etcd_rendezvous.py: a keepalive stream broken by the member's death was
  // cancelled before its status was read, so CANCELLED (not retried) hid UNAVAILABLE and the
  // client kept renewing on the dead member until the node fenced itself.
  if (auto why = EtcdTestCluster::unavailableReason(); !why.empty()) DDPRUN_SKIP(why);
  EtcdTestCluster cluster;
  std::size_t leader = cluster.leader();
  EtcdClient client(optionsFor(cluster, static_cast<int>(leader)));
  int64_t lease = client.grantLease(std::chrono::seconds(10));
  CHECK(client.keepAliveOnce(lease) > 0);
  cluster.kill(leader);
  CHECK(client.keepAliveOnce(lease) > 0);
  CHECK(client.currentEndpoint() != leader);
}

TEST_CASE("etcd client: a watch from a compacted revision fails with EtcdCompacted, naming the revision", "[etcd]") {
  if (auto why = EtcdTestCluster::unavailableReason(); !why.empty()) DDPRUN_SKIP(why);
  if (access("/usr/bin/etcdctl", X_OK) != 0) DDPRUN_SKIP("needs etcdctl (apt-get install etcd-client)");
  EtcdTestCluster cluster;
  EtcdClient client(optionsFor(cluster));
  int64_t first = client.put("/c/key", "1");
  int64_t last = client.put("/c/key", "2");
  cluster.compact(last);
  EtcdWatch watch(client, "/c/key", "", first - 1);
  try {
    watch.next(std::chrono::steady_clock::now() + kSafetyBound);
    FAIL("no error from a watch on a compacted revision");
  } catch (const ddprun::EtcdCompacted& e) {
    CHECK_THAT(e.what(), Catch::Matchers::Contains("revision " + std::to_string(first) + " was compacted"));
  }
}

TEST_CASE("etcd client: a watch on a member that freezes resumes on another one", "[etcd]") {
  // A frozen member keeps the stream open and sends nothing: only the channel's keepalive
  // (ping every 5 s, etcd's minimum, dropped after 3 s more) ends it; the watch then resumes
  // elsewhere from the next revision, so the put made meanwhile is still seen.
  if (auto why = EtcdTestCluster::unavailableReason(); !why.empty()) DDPRUN_SKIP(why);
  EtcdTestCluster cluster;
  std::size_t leader = cluster.leader();
  std::size_t frozen = (leader + 1) % 3;
  EtcdClient watcher(optionsFor(cluster, static_cast<int>(frozen)));
  EtcdClient writer(optionsFor(cluster, static_cast<int>(leader)));
  int64_t rev = 0;
  watcher.get("/z/key", &rev);
  EtcdWatch watch(watcher, "/z/key", "", rev);
  writer.put("/z/key", "before");
  awaitEvent(watch, [](const mvccpb::Event& e) { return e.kv().value() == "before"; });
  cluster.stop(frozen);
  writer.put("/z/key", "while frozen");
  auto ev = awaitEvent(watch, [](const mvccpb::Event& e) { return e.kv().value() == "while frozen"; });
  CHECK(ev.type() == mvccpb::Event::PUT);
  cluster.cont(frozen);
}
