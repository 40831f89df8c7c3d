// torch's store on etcd (store/forward/etcd_forwarding.h) and the operations only TCPStore needs
// (store/etcd/etcd_key_store.h: append, multi_get, multi_set, list_keys, compare_set's "was
// missing"), against a real 3-member etcd cluster. The keys are the ones libddp's workers read.
#include <catch2/catch.hpp>

#include <future>
#include <memory>
#include <string>
#include <vector>

#include "common/store_prefix.h"
#include "ddprun/v1/store.pb.h"
#include "etcd/etcd_client.h"
#include "etcd_test_cluster.h"
#include "safety_bound.h"
#include "store/core/store_status.h"
#include "store/etcd/etcd_key_store.h"
#include "store/forward/etcd_forwarding.h"
#include "test_skip.h"

using ddprun::test::EtcdTestCluster;
using ddprun::test::kSafetyBound;
using std::chrono::milliseconds;

namespace {

constexpr const char* kRoot = "/fwd";
constexpr const char* kRun = "job7";

ddprun::EtcdClientOptions clientOptions(const EtcdTestCluster& cluster) {
  ddprun::EtcdClientOptions o;
  o.endpoints = cluster.endpoints();
  o.callTimeout = std::chrono::seconds(1);
  o.retryTimeout = kSafetyBound;
  return o;
}

std::string roundPrefix(uint64_t round) { return std::string(kRoot) + ddprun::storePrefix(kRun, round); }

template <typename M>
void scoped(M* m, uint64_t round) {
  m->mutable_scope()->set_run_id(kRun);
  m->mutable_scope()->set_round(round);
}

int32_t codeOf(const ddprun::v1::StoreResponse& r) { return r.has_status() ? r.status().code() : 0; }

}  // namespace

TEST_CASE("etcd key store: append, multi_get, multi_set, list_keys and compare_set on a missing key", "[etcd][store]") {
  if (auto why = EtcdTestCluster::unavailableReason(); !why.empty()) DDPRUN_SKIP(why);
  EtcdTestCluster cluster;
  ddprun::EtcdKeyStoreOptions o;
  o.client = clientOptions(cluster);
  o.prefix = roundPrefix(1);
  ddprun::EtcdKeyStore store(o);
  store.append("log", "a");
  store.append("log", "bc");
  CHECK(store.get("log") == "abc");
  // More keys than one etcd transaction takes (128 operations): written and read in parts.
  std::vector<std::string> keys, values;
  for (int i = 0; i < 300; ++i) {
    keys.push_back("k" + std::to_string(i));
    values.push_back(std::string(i % 7, 'x') + std::to_string(i));
  }
  store.multiSet(keys, values);
  keys.push_back("missing");
  std::vector<bool> found;
  auto got = store.multiGet(keys, &found);
  REQUIRE(got.size() == keys.size());
  REQUIRE(found.size() == keys.size());
  for (int i = 0; i < 300; ++i) {
    CHECK(found[i]);
    CHECK(got[i] == values[i]);
  }
  CHECK_FALSE(found.back());
  CHECK(got.back().empty());
  CHECK(store.listKeys().size() == 301);  // the 300 and "log"
  CHECK(store.numKeys() == 301);
  bool wasMissing = false;
  CHECK(store.compareSet("c", "", "x", &wasMissing) == "x");
  CHECK(wasMissing);
  CHECK(store.compareSet("c", "other", "y", &wasMissing) == "x");
  CHECK_FALSE(wasMissing);
  CHECK(store.compareSet("absent", "expected", "y", &wasMissing).empty());
  CHECK(wasMissing);
  CHECK_FALSE(store.check({"absent"}));
}

TEST_CASE("etcd forwarding: each request runs on its own round's keys, an old round's is refused, waits time out "
          "naming the key", "[etcd][store]") {
  if (auto why = EtcdTestCluster::unavailableReason(); !why.empty()) DDPRUN_SKIP(why);
  EtcdTestCluster cluster;
  ddprun::EtcdClient raw(clientOptions(cluster));
  // The etcd driver writes each round's marker with the round.
  raw.put(roundPrefix(1) + "alive", "");
  raw.put(roundPrefix(2) + "alive", "");
  ddprun::EtcdForwardingOptions fo;
  fo.client = clientOptions(cluster);
  fo.root = std::string(kRoot) + "/";  // a trailing '/' is dropped
  ddprun::EtcdForwarding etcd(fo);

  ddprun::v1::StoreRequest set;
  set.set_id(5);
  scoped(set.mutable_set(), 2);
  set.mutable_set()->set_key("/init/");
  set.mutable_set()->set_value("v2");
  auto r = etcd.call(set, milliseconds(1000));
  CHECK(r.id() == 5);
  CHECK(codeOf(r) == 0);
  // libddp's workers of round 2 read it under the same name.
  ddprun::EtcdKeyStoreOptions so;
  so.client = clientOptions(cluster);
  so.prefix = roundPrefix(2);
  so.fenceByRound = true;
  so.timeout = kSafetyBound;
  ddprun::EtcdKeyStore worker(so);
  CHECK(worker.get("/init/") == "v2");
  worker.set("from-cpp", "hello");

  ddprun::v1::StoreRequest get;
  scoped(get.mutable_multi_get(), 2);
  get.mutable_multi_get()->add_keys("from-cpp");
  get.mutable_multi_get()->add_keys("nope");
  r = etcd.call(get, milliseconds(1000));
  REQUIRE(codeOf(r) == 0);
  REQUIRE(r.multi_get().values_size() == 2);
  CHECK(r.multi_get().values(0) == "hello");
  CHECK(r.multi_get().found(0));
  CHECK_FALSE(r.multi_get().found(1));

  // Round 1 is not round 2: the key is not there.
  scoped(get.mutable_multi_get(), 1);
  r = etcd.call(get, milliseconds(1000));
  REQUIRE(codeOf(r) == 0);
  CHECK_FALSE(r.multi_get().found(0));

  ddprun::v1::StoreRequest add;
  scoped(add.mutable_add(), 2);
  add.mutable_add()->set_key("n");
  add.mutable_add()->set_delta(3);
  r = etcd.call(add, milliseconds(1000));
  CHECK(r.add().value() == 3);

  ddprun::v1::StoreRequest cas;
  scoped(cas.mutable_compare_set(), 2);
  cas.mutable_compare_set()->set_key("leader");
  cas.mutable_compare_set()->set_desired("0");
  r = etcd.call(cas, milliseconds(1000));
  CHECK(r.compare_set().value() == "0");
  CHECK(r.compare_set().key_was_missing());

  ddprun::v1::StoreRequest wait;
  scoped(wait.mutable_wait(), 2);
  wait.mutable_wait()->add_keys("later");
  wait.mutable_wait()->set_timeout_ms(200);
  r = etcd.call(wait, milliseconds(200));
  CHECK(codeOf(r) == static_cast<int32_t>(ddprun::StoreCode::kDeadlineExceeded));
  CHECK_THAT(r.status().message(), Catch::Contains("timed out after 200 ms") && Catch::Contains("later"));
  // A wait released by another client's set.
  wait.mutable_wait()->set_timeout_ms(static_cast<uint32_t>(kSafetyBound.count()));
  auto pending = std::async(std::launch::async, [&] { return etcd.call(wait, kSafetyBound); });
  worker.set("later", "now");
  REQUIRE(pending.wait_for(kSafetyBound) == std::future_status::ready);
  CHECK(codeOf(pending.get()) == 0);

  // Round 1 is over (the driver dropped its keys, the marker with them): its requests fail.
  raw.deletePrefix(roundPrefix(1));
  scoped(set.mutable_set(), 1);
  r = etcd.call(set, milliseconds(1000));
  CHECK(codeOf(r) == static_cast<int32_t>(ddprun::StoreCode::kFailedPrecondition));
  CHECK_THAT(r.status().message(), Catch::Contains("stale round"));
  CHECK(raw.countPrefix(roundPrefix(1)) == 0);  // nothing written behind the fence

  // Bad input: an empty key, a request without a run, and no operation at all.
  ddprun::v1::StoreRequest empty;
  scoped(empty.mutable_set(), 2);
  r = etcd.call(empty, milliseconds(1000));
  CHECK(codeOf(r) == static_cast<int32_t>(ddprun::StoreCode::kInvalidArgument));
  ddprun::v1::StoreRequest noRun;
  noRun.mutable_set()->set_key("k");
  CHECK(codeOf(etcd.call(noRun, milliseconds(1000))) == static_cast<int32_t>(ddprun::StoreCode::kInvalidArgument));
  ddprun::v1::StoreRequest none;
  CHECK(codeOf(etcd.call(none, milliseconds(1000))) == static_cast<int32_t>(ddprun::StoreCode::kInvalidArgument));
  ddprun::v1::StoreRequest ping;
  ping.mutable_ping();
  CHECK(etcd.call(ping, milliseconds(1000)).has_ping());
}
