// The worker SDK's stores: InProcessStore (N ranks as N threads), PrefixStore, and RemoteStore
// against a real store service in this process on loopback, scoped by run id and round.
#include <catch2/catch.hpp>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "rpc/grpc_util.h"
#include "store/grpc/store_service.h"
#include "worker_sdk/in_process_store.h"
#include "worker_sdk/prefix_store.h"
#include "worker_sdk/remote_store.h"
#include "safety_bound.h"

using Catch::Matchers::Contains;
using namespace std::chrono_literals;

namespace {

using Clock = std::chrono::steady_clock;

// The semantics every ddp::Store shares.
void checkStoreSemantics(ddp::Store& store) {
  const std::string bytes("a\0b\xff", 4);
  store.set("k", bytes);
  CHECK(store.get("k") == bytes);  // bytes, not C strings
  store.set("k", "v2");
  CHECK(store.get("k") == "v2");

  CHECK(store.add("n", 5) == 5);
  CHECK(store.add("n", -7) == -2);
  CHECK(store.get("n") == "-2");
  CHECK_THROWS_AS(store.add("k", 1), ddprun::StateError);

  CHECK(store.compareSet("cas", "", "first") == "first");    // missing + empty expected: set
  CHECK(store.compareSet("cas", "wrong", "x") == "first");   // mismatch: unchanged
  CHECK(store.compareSet("cas", "first", "second") == "second");
  CHECK(store.compareSet("absent", "expected", "x").empty());  // missing + non-empty expected
  CHECK_FALSE(store.check({"absent"}));

  CHECK(store.check({"k", "n", "cas"}));
  CHECK_FALSE(store.check({"k", "nope"}));
  CHECK(store.numKeys() == 3);
  CHECK(store.deleteKey("cas"));
  CHECK_FALSE(store.deleteKey("cas"));
  CHECK(store.numKeys() == 2);

  CHECK_THROWS_AS(store.set("", "v"), ddprun::ConfigError);

  const auto start = Clock::now();
  CHECK_THROWS_WITH(store.wait({"k", "never"}, 150ms), Contains("'never'"));
  const auto waited = Clock::now() - start;
  CHECK(waited >= 140ms);
  CHECK(waited < ddprun::test::kSafetyBound);  // the 150 ms timeout, not the store's (minutes)
  CHECK_THROWS_AS(store.wait({"never"}, 50ms), ddprun::TimeoutError);

  // A wait in one thread ends when another thread sets the key.
  std::thread setter([&] {
    std::this_thread::sleep_for(50ms);
    store.set("late", "here");
  });
  store.wait({"late"}, 10s);
  CHECK(store.get("late") == "here");
  setter.join();
}

}  // namespace

TEST_CASE("InProcessStore: every operation", "[sdk]") {
  ddp::InProcessStore store(ddp::InProcessStoreOptions{5s});
  checkStoreSemantics(store);
}

TEST_CASE("InProcessStore: get waits up to its timeout and names the key", "[sdk]") {
  ddp::InProcessStore store(ddp::InProcessStoreOptions{100ms});
  CHECK(store.timeout() == 100ms);
  CHECK_THROWS_WITH(store.get("missing"), Contains("'missing'") && Contains("100 ms"));
  store.wait({});  // nothing to wait for
}

TEST_CASE("InProcessStore: N ranks as N threads count to N", "[sdk]") {
  ddp::InProcessStore store;
  constexpr int kRanks = 8;
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r) {
    ranks.emplace_back([&store, r] {
      store.set("rank/" + std::to_string(r), std::to_string(r));
      store.add("arrived", 1);
    });
  }
  std::vector<std::string> keys;
  for (int r = 0; r < kRanks; ++r) keys.push_back("rank/" + std::to_string(r));
  store.wait(keys, 10s);
  for (auto& t : ranks) t.join();
  CHECK(store.get("arrived") == std::to_string(kRanks));
}

TEST_CASE("PrefixStore keeps its keys apart", "[sdk]") {
  ddp::InProcessStore base(ddp::InProcessStoreOptions{5s});
  ddp::PrefixStore a("a/", base);
  ddp::PrefixStore b("b/", base);
  a.set("x", "1");
  CHECK_FALSE(b.check({"x"}));
  CHECK(base.get("a/x") == "1");
  CHECK(a.add("n", 2) == 2);
  CHECK(base.check({"a/n"}));
  CHECK(a.timeout() == 5s);
  CHECK_THROWS_AS(a.set("", "v"), ddprun::ConfigError);
  CHECK_THROWS_WITH(b.wait({"x"}, 20ms), Contains("b/x"));
}

TEST_CASE("makeStore needs DDPRUN_STORE_ADDR and a run id", "[sdk]") {
  ddp::Env env;
  env.runId = "job";
  CHECK_THROWS_WITH(ddp::makeStore(env), Contains("DDPRUN_STORE_ADDR"));
  env.storeAddr = "127.0.0.1:1";
  env.runId.clear();
  CHECK_THROWS_WITH(ddp::makeStore(env), Contains("TORCHELASTIC_RUN_ID"));

  env.runId = "job";
  env.round = 4;
  env.token = "t";
  const auto o = ddp::remoteStoreOptions(env);
  CHECK(o.address == "127.0.0.1:1");
  CHECK(o.runId == "job");
  CHECK(o.round == 4);
  CHECK(o.token == "t");
}

TEST_CASE("RemoteStore: every operation against the store service, fenced by round", "[sdk]") {
  // The real service on loopback, in this process; the rendezvous would say which round is current.
  std::atomic<uint64_t> currentRound{1};
  ddprun::StoreCoreOptions coreOptions;
  coreOptions.token = "tok";
  coreOptions.roundIsCurrent = [&](const std::string&, uint64_t round) { return round == currentRound; };
  ddprun::StoreCore core(coreOptions);
  ddprun::StoreService service(core);
  int port = 0;
  grpc::ServerBuilder builder;
  ddprun::applyServerDefaults(builder);
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  REQUIRE(server);

  ddp::Env env;
  env.storeAddr = "127.0.0.1:" + std::to_string(port);
  env.runId = "job";
  env.round = 1;
  env.token = "tok";
  auto round1 = ddp::makeStore(env, 5s);
  checkStoreSemantics(*round1);
  round1->set("nccl_id", "old");

  // The group restarts into round 2: it never sees round 1's values, and round 1 is refused.
  currentRound = 2;
  env.round = 2;
  auto round2 = ddp::makeStore(env, 5s);
  CHECK_FALSE(round2->check({"nccl_id"}));
  CHECK(round2->numKeys() == 0);
  CHECK_THROWS_AS(round2->wait({"nccl_id"}, 100ms), ddprun::TimeoutError);
  CHECK_THROWS_AS(round1->get("nccl_id"), ddprun::StateError);

  ddp::RemoteStoreOptions wrongToken = ddp::remoteStoreOptions(env);
  wrongToken.token = "wrong";
  wrongToken.connectTimeout = 2s;
  CHECK_THROWS_WITH(ddp::RemoteStore(wrongToken).set("k", "v"), Contains("invalid job token"));

  core.shutdown();
  service.shutdown();
  server->Shutdown();
}
