// ddp::FileStore, the single-node store (a folder per round, DDPRUN_STORE_ADDR=file:///path):
// every operation, N threads as N ranks (each with its own FileStore, as separate processes would
// have), blocking gets, timeouts that name the key, rounds that do not see each other, and
// makeStore() choosing it for a file:// address.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "test_util.h"
#include "worker_sdk/env.h"
#include "worker_sdk/file_store.h"
#include "worker_sdk/remote_store.h"

using Catch::Matchers::Contains;
using namespace std::chrono_literals;

namespace {

ddp::FileStore makeFileStore(const std::string& path, std::chrono::milliseconds timeout = 5s) {
  ddp::FileStoreOptions o;
  o.path = path;
  o.timeout = timeout;
  return ddp::FileStore(o);
}

}  // namespace

TEST_CASE("FileStore: set, get, add, compareSet, check, deleteKey, numKeys", "[sdk]") {
  ddprun::test::TempDir dir;
  auto store = makeFileStore(dir.path());
  CHECK(store.numKeys() == 0);

  const std::string bytes("a\0b\xff/..\n", 8);
  store.set("k", bytes);
  CHECK(store.get("k") == bytes);  // bytes, not C strings
  store.set("k", "v2");
  CHECK(store.get("k") == "v2");
  store.set("empty", "");
  CHECK(store.get("empty").empty());

  CHECK(store.add("n", 5) == 5);
  CHECK(store.add("n", -7) == -2);
  CHECK(store.get("n") == "-2");
  CHECK_THROWS_AS(store.add("k", 1), ddprun::StateError);

  CHECK(store.compareSet("cas", "", "first") == "first");   // missing + empty expected: set
  CHECK(store.compareSet("cas", "wrong", "x") == "first");  // mismatch: unchanged
  CHECK(store.compareSet("cas", "first", "second") == "second");
  CHECK(store.compareSet("missing", "something", "x").empty());  // missing + expected: unchanged
  CHECK_FALSE(store.check({"missing"}));

  CHECK(store.check({"k", "n", "cas"}));
  CHECK_FALSE(store.check({"k", "nope"}));
  CHECK(store.numKeys() == 4);  // k, empty, n, cas (the lock file is no key)

  CHECK(store.deleteKey("k"));
  CHECK_FALSE(store.deleteKey("k"));
  CHECK_FALSE(store.check({"k"}));
  CHECK(store.numKeys() == 3);

  store.wait({"n", "cas"});  // present: returns at once
  CHECK_THROWS_AS(store.set("", "v"), ddprun::ConfigError);
  CHECK_THROWS_AS(store.get(std::string(ddp::FileStore::kMaxKeyBytes + 1, 'x')), ddprun::ConfigError);
  store.set(std::string(ddp::FileStore::kMaxKeyBytes, 'x'), "longest");
  CHECK(store.get(std::string(ddp::FileStore::kMaxKeyBytes, 'x')) == "longest");
}

TEST_CASE("FileStore: two stores over one folder share keys", "[sdk]") {
  ddprun::test::TempDir dir;
  auto a = makeFileStore(dir.path());
  auto b = makeFileStore(dir.path());
  a.set("ddp/gloo/default/rank_0", "addr");
  CHECK(b.get("ddp/gloo/default/rank_0") == "addr");
  CHECK(b.add("count", 1) == 1);
  CHECK(a.add("count", 1) == 2);
}

TEST_CASE("FileStore: N threads adding concurrently give the exact total", "[sdk]") {
  ddprun::test::TempDir dir;
  constexpr int kThreads = 8;
  constexpr int kAdds = 100;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto store = makeFileStore(dir.path());  // one store per "rank", as separate processes
      for (int i = 0; i < kAdds; ++i) store.add("counter", t + 1);
      store.compareSet("winner", "", std::to_string(t));  // exactly one thread wins
    });
  }
  for (auto& t : threads) t.join();
  auto store = makeFileStore(dir.path());
  CHECK(store.get("counter") == std::to_string(kAdds * kThreads * (kThreads + 1) / 2));
  const std::string winner = store.get("winner");
  CHECK(store.compareSet("winner", "", "late") == winner);
  CHECK(store.numKeys() == 2);  // no temporary file left behind counts as a key
}

TEST_CASE("FileStore: get blocks until another thread sets the key", "[sdk]") {
  ddprun::test::TempDir dir;
  auto reader = makeFileStore(dir.path());
  const auto start = std::chrono::steady_clock::now();
  std::thread writer([&] {
    std::this_thread::sleep_for(100ms);
    makeFileStore(dir.path()).set("nccl_id", "id-bytes");
  });
  CHECK(reader.get("nccl_id") == "id-bytes");
  const auto waited = std::chrono::steady_clock::now() - start;
  writer.join();
  CHECK(waited >= 90ms);  // it did block (how soon it wakes after the set is a speed question)

  std::thread second([&] {
    std::this_thread::sleep_for(50ms);
    makeFileStore(dir.path()).set("b", "2");
  });
  reader.wait({"nccl_id", "b"});
  second.join();
  CHECK(reader.check({"b"}));
}

TEST_CASE("FileStore: a timeout names the missing key", "[sdk]") {
  ddprun::test::TempDir dir;
  auto store = makeFileStore(dir.path(), 50ms);
  store.set("here", "1");
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(store.get("rank_3_addr"), Contains("rank_3_addr") && Contains("timed out"));
  CHECK(std::chrono::steady_clock::now() - start >= 45ms);
  CHECK_THROWS_AS(store.get("rank_3_addr"), ddprun::TimeoutError);
  CHECK_THROWS_WITH(store.wait({"here", "gone"}, 20ms), Contains("'gone'") && !Contains("'here'"));
}

TEST_CASE("FileStore: another round's folder sees nothing", "[sdk]") {
  ddprun::test::TempDir dir;
  auto round0 = makeFileStore(dir.file("round_0"), 30ms);
  auto round1 = makeFileStore(dir.file("round_1"), 30ms);
  round0.set("ddp/nccl/default/unique_id", "old");
  round0.add("n", 3);
  CHECK(round1.numKeys() == 0);
  CHECK_FALSE(round1.check({"ddp/nccl/default/unique_id"}));
  CHECK_THROWS_AS(round1.get("ddp/nccl/default/unique_id"), ddprun::TimeoutError);
  CHECK(round1.add("n", 1) == 1);
  CHECK(round0.get("n") == "3");
}

TEST_CASE("makeStore: a file:// address gives a FileStore over the folder", "[sdk]") {
  ddprun::test::TempDir dir;
  const std::string folder = dir.file("store/round_2");
  std::map<std::string, std::string> vars = {
      {"RANK", "0"},           {"LOCAL_RANK", "0"},        {"WORLD_SIZE", "1"},
      {"LOCAL_WORLD_SIZE", "1"}, {"GROUP_RANK", "0"},     {"GROUP_WORLD_SIZE", "1"},
      {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}, {"TORCHELASTIC_RUN_ID", "job"},
      {"DDPRUN_STORE_ADDR", "file://" + folder}, {"DDPRUN_STORE_PREFIX", "/run/job/round/2/"},
      {"DDPRUN_ROUND", "2"}};
  const auto env = ddp::Env::fromEnvironment(vars);
  CHECK(env.round == 2);
  auto store = ddp::makeStore(env, 40ms);
  REQUIRE(dynamic_cast<ddp::FileStore*>(store.get()) != nullptr);
  CHECK(store->timeout() == 40ms);
  store->set("x", "1");
  CHECK(makeFileStore(folder).get("x") == "1");

  vars["DDPRUN_STORE_ADDR"] = "file://relative/path";
  CHECK_THROWS_AS(ddp::makeStore(ddp::Env::fromEnvironment(vars)), ddprun::ConfigError);
}
