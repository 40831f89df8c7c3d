// RunScopedStore: every operation, scoping by run and round, and asynchronous waits driven by a
// fake time (plain time points handed to expire()); N threads stand in for N workers.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "store/core/run_scoped_store.h"

using ddprun::RunScopedStore;
using ddprun::StoreScope;
using namespace std::chrono_literals;

namespace {

// A fake time: an arbitrary origin on the store's clock, never compared with the real now().
const RunScopedStore::TimePoint kT0{};

// Records how a wait ended and how many times it was called back.
struct WaitProbe {
  std::atomic<int> calls{0};
  std::atomic<bool> satisfied{false};
  RunScopedStore::WaitCallback callback() {
    return [this](bool ok) {
      satisfied = ok;
      ++calls;
    };
  }
};

}  // namespace

TEST_CASE("set, get, check, deleteKey and numKeys", "[store]") {
  RunScopedStore store;
  const StoreScope s{"job", 1};
  CHECK_FALSE(store.get(s, "a").has_value());
  store.set(s, "a", std::string("x\0y", 3));
  REQUIRE(store.get(s, "a") == std::string("x\0y", 3));  // bytes, not C strings
  store.set(s, "a", "overwritten");
  CHECK(store.get(s, "a") == "overwritten");
  store.set(s, "b", "");
  CHECK(store.check(s, {"a", "b"}));
  CHECK_FALSE(store.check(s, {"a", "c"}));
  CHECK(store.missing(s, {"c", "a", "d"}) == std::vector<std::string>{"c", "d"});
  CHECK(store.numKeys(s) == 2);
  CHECK(store.deleteKey(s, "a"));
  CHECK_FALSE(store.deleteKey(s, "a"));
  CHECK(store.numKeys(s) == 1);
  CHECK(store.numKeys({"other", 1}) == 0);
}

TEST_CASE("keys are scoped by run id and round", "[store]") {
  RunScopedStore store;
  store.set({"job", 1}, "nccl_id", "old");
  CHECK_FALSE(store.get({"job", 2}, "nccl_id").has_value());
  CHECK_FALSE(store.get({"other", 1}, "nccl_id").has_value());
  store.set({"job", 2}, "nccl_id", "new");
  CHECK(store.get({"job", 1}, "nccl_id") == "old");
  CHECK(store.get({"job", 2}, "nccl_id") == "new");
  CHECK(store.numKeys({"job", 2}) == 1);

  store.dropRoundsBefore("job", 2);
  CHECK_FALSE(store.get({"job", 1}, "nccl_id").has_value());
  CHECK(store.get({"job", 2}, "nccl_id") == "new");
  store.dropRun("job");
  CHECK(store.numKeys({"job", 2}) == 0);
}

TEST_CASE("add keeps a decimal counter and rejects other values", "[store]") {
  RunScopedStore store;
  const StoreScope s{"job", 0};
  CHECK(store.add(s, "n", 5) == 5);
  CHECK(store.add(s, "n", -7) == -2);
  CHECK(store.get(s, "n") == "-2");  // text, as c10d keeps it
  store.set(s, "m", "40");
  CHECK(store.add(s, "m", 2) == 42);

  store.set(s, "text", "12abc");
  CHECK_THROWS_AS(store.add(s, "text", 1), ddprun::StateError);
  store.set(s, "empty", "");
  CHECK_THROWS_AS(store.add(s, "empty", 1), ddprun::StateError);
  store.set(s, "big", std::to_string(INT64_MAX));
  CHECK_THROWS_AS(store.add(s, "big", 1), ddprun::StateError);
  CHECK(store.get(s, "big") == std::to_string(INT64_MAX));  // a failed add changes nothing

  // The messages name the key escaped and cut, never its raw bytes (found by tests/fuzz).
  const std::string evil = "\x1b]0;owned\x07\n" + std::string(4000, 'k');
  store.set(s, evil, "not a number");
  store.set(s, evil + "2", std::to_string(INT64_MAX));
  for (const auto& [key, delta] : {std::pair{evil, int64_t{1}}, std::pair{evil + "2", int64_t{1}}}) {
    try {
      store.add(s, key, delta);
      FAIL("add did not throw");
    } catch (const ddprun::StateError& e) {
      const std::string message = e.what();
      CHECK(message.find("\\x1b]0;owned\\x07\\x0a") != std::string::npos);
      CHECK(message.find('\x1b') == std::string::npos);
      CHECK(message.size() < 400);
    }
  }
}

TEST_CASE("compareSet follows c10d", "[store]") {
  RunScopedStore store;
  const StoreScope s{"job", 0};
  // Missing key: only an empty expected sets it.
  CHECK(store.compareSet(s, "k", "something", "v1") == "");
  CHECK_FALSE(store.get(s, "k").has_value());
  CHECK(store.compareSet(s, "k", "", "v1") == "v1");
  // Present key: swapped only on a match; the value after the call comes back either way.
  CHECK(store.compareSet(s, "k", "wrong", "v2") == "v1");
  CHECK(store.compareSet(s, "k", "v1", "v2") == "v2");
  CHECK(store.get(s, "k") == "v2");
}

TEST_CASE("limits on keys, values and run ids", "[store]") {
  RunScopedStore store;
  const StoreScope s{"job", 0};
  CHECK_THROWS_AS(store.set(s, "", "v"), ddprun::ConfigError);
  CHECK_THROWS_AS(store.get(s, std::string(RunScopedStore::kMaxKeyBytes + 1, 'k')), ddprun::ConfigError);
  store.set(s, std::string(RunScopedStore::kMaxKeyBytes, 'k'), "v");  // exactly the limit is fine
  CHECK_THROWS_AS(store.set(s, "big", std::string(RunScopedStore::kMaxValueBytes + 1, 'v')),
                  ddprun::ConfigError);
  CHECK_THROWS_AS(store.numKeys({std::string(RunScopedStore::kMaxKeyBytes + 1, 'r'), 0}),
                  ddprun::ConfigError);
  CHECK_THROWS_AS(store.check(s, {"ok", ""}), ddprun::ConfigError);
}

TEST_CASE("quoteKeys bounds the keys an error message names", "[store]") {
  CHECK(ddprun::quoteKeys({"a", "b"}) == "'a', 'b'");
  std::vector<std::string> many;
  for (int i = 0; i < 20; ++i) many.push_back("k" + std::to_string(i));
  CHECK(ddprun::quoteKeys(many) == "'k0', 'k1', 'k2', 'k3', 'k4', 'k5', 'k6', 'k7' and 12 more");
}

TEST_CASE("waitAsync is satisfied at once when the keys exist", "[store]") {
  RunScopedStore store;
  const StoreScope s{"job", 0};
  store.set(s, "a", "1");
  WaitProbe probe;
  auto id = store.waitAsync(s, {"a"}, kT0, probe.callback());
  REQUIRE(id.has_value());
  CHECK(probe.calls == 1);  // on this thread, before waitAsync returned
  CHECK(probe.satisfied);
  CHECK_FALSE(store.cancelWait(*id));
  CHECK_FALSE(store.nextDeadline().has_value());

  WaitProbe none;
  store.waitAsync(s, {}, kT0, none.callback());  // no keys: nothing to wait for
  CHECK(none.calls == 1);
  CHECK(none.satisfied);
}

TEST_CASE("waitAsync is satisfied by another thread's set, once", "[store]") {
  RunScopedStore store;
  const StoreScope s{"job", 0};
  WaitProbe probe;
  REQUIRE(store.waitAsync(s, {"a", "b"}, kT0 + 10s, probe.callback()).has_value());
  CHECK(store.nextDeadline() == kT0 + 10s);
  std::thread([&] { store.set(s, "a", "1"); }).join();
  CHECK(probe.calls == 0);  // still missing "b"
  std::thread([&] { store.add(s, "b", 1); }).join();
  CHECK(probe.calls == 1);
  CHECK(probe.satisfied);
  CHECK_FALSE(store.nextDeadline().has_value());
  // Later writes and expiry must not call it again.
  store.set(s, "a", "2");
  store.expire(kT0 + 1h);
  CHECK(probe.calls == 1);
}

TEST_CASE("a key deleted before the last one arrives keeps the wait pending", "[store]") {
  RunScopedStore store;
  const StoreScope s{"job", 0};
  WaitProbe probe;
  store.waitAsync(s, {"a", "b"}, kT0 + 10s, probe.callback());
  store.set(s, "a", "1");
  store.deleteKey(s, "a");
  store.compareSet(s, "b", "", "1");
  CHECK(probe.calls == 0);
  store.set(s, "a", "again");
  CHECK(probe.calls == 1);
  CHECK(probe.satisfied);
}

TEST_CASE("expire(now) fails waits whose deadline passed, in deadline order", "[store]") {
  RunScopedStore store;
  const StoreScope s{"job", 0};
  WaitProbe early, late;
  store.waitAsync(s, {"x"}, kT0 + 2s, late.callback());
  store.waitAsync(s, {"x"}, kT0 + 1s, early.callback());
  CHECK(store.nextDeadline() == kT0 + 1s);
  store.expire(kT0 + 999ms);
  CHECK(early.calls == 0);
  store.expire(kT0 + 1s);
  CHECK(early.calls == 1);
  CHECK_FALSE(early.satisfied);
  CHECK(late.calls == 0);
  CHECK(store.nextDeadline() == kT0 + 2s);
  store.expire(kT0 + 5s);
  CHECK(late.calls == 1);
  CHECK_FALSE(store.nextDeadline().has_value());
  store.set(s, "x", "too late");
  CHECK(early.calls == 1);
  CHECK(late.calls == 1);
}

TEST_CASE("cancelWait forgets a wait without calling it", "[store]") {
  RunScopedStore store;
  const StoreScope s{"job", 0};
  WaitProbe probe;
  auto id = store.waitAsync(s, {"x"}, kT0 + 1s, probe.callback());
  REQUIRE(id.has_value());
  CHECK(store.cancelWait(*id));
  CHECK_FALSE(store.cancelWait(*id));
  store.set(s, "x", "1");
  store.expire(kT0 + 1h);
  CHECK(probe.calls == 0);
}

TEST_CASE("dropping a round, a run or the store fails its waits", "[store]") {
  RunScopedStore store;
  WaitProbe old, current, otherRun;
  store.waitAsync({"job", 1}, {"x"}, kT0 + 1h, old.callback());
  store.waitAsync({"job", 2}, {"x"}, kT0 + 1h, current.callback());
  store.waitAsync({"other", 1}, {"x"}, kT0 + 1h, otherRun.callback());
  store.dropRoundsBefore("job", 2);
  CHECK(old.calls == 1);
  CHECK_FALSE(old.satisfied);
  CHECK(current.calls == 0);
  store.dropRun("job");
  CHECK(current.calls == 1);
  CHECK(otherRun.calls == 0);
  store.close();
  CHECK(otherRun.calls == 1);
  CHECK_FALSE(otherRun.satisfied);
  CHECK(store.closed());
  CHECK_THROWS_AS(store.set({"job", 3}, "k", "v"), ddprun::ClosedError);
  CHECK_THROWS_AS(store.waitAsync({"job", 3}, {"k"}, kT0, [](bool) {}), ddprun::ClosedError);
}

TEST_CASE("a callback may call back into the store", "[store]") {
  // The store's lock is not held while callbacks run; this would deadlock otherwise.
  RunScopedStore store;
  const StoreScope s{"job", 0};
  std::optional<std::string> seen;
  store.waitAsync(s, {"k"}, kT0 + 1s, [&](bool) {
    seen = store.get(s, "k");
    store.add(s, "callbacks", 1);
  });
  store.set(s, "k", "v");
  CHECK(seen == "v");
  CHECK(store.get(s, "callbacks") == "1");
}

TEST_CASE("pending waits per run are bounded", "[store]") {
  RunScopedStore store(ddprun::RunScopedStoreOptions{.maxWaitersPerRun = 2});
  WaitProbe a, b, c, d;
  CHECK(store.waitAsync({"job", 0}, {"x"}, kT0 + 1s, a.callback()).has_value());
  CHECK(store.waitAsync({"job", 1}, {"x"}, kT0 + 1s, b.callback()).has_value());
  CHECK_FALSE(store.waitAsync({"job", 0}, {"y"}, kT0 + 1s, c.callback()).has_value());
  CHECK(store.waitAsync({"other", 0}, {"x"}, kT0 + 1s, d.callback()).has_value());  // per run
  store.set({"job", 0}, "x", "1");  // frees a slot
  CHECK(store.waitAsync({"job", 0}, {"y"}, kT0 + 1s, c.callback()).has_value());
  store.expire(kT0 + 1s);
  CHECK(a.calls == 1);
  CHECK(b.calls == 1);
  CHECK(c.calls == 1);  // only the accepted wait called back
  CHECK(d.calls == 1);
}

TEST_CASE("threads hammering add give the exact total", "[store]") {
  RunScopedStore store;
  const StoreScope s{"job", 0};
  constexpr int kThreads = 8;
  constexpr int kAdds = 2000;
  WaitProbe allDone;
  store.waitAsync(s, {"done"}, kT0 + 1h, allDone.callback());
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kAdds; ++i) store.add(s, "counter", 1);
      if (store.add(s, "finished", 1) == kThreads) store.set(s, "done", "1");
    });
  }
  for (auto& t : threads) t.join();
  CHECK(store.get(s, "counter") == std::to_string(kThreads * kAdds));
  CHECK(allDone.calls == 1);
  CHECK(allDone.satisfied);
}

TEST_CASE("each of many concurrent waits is called back exactly once", "[store]") {
  RunScopedStore store;
  const StoreScope s{"job", 0};
  constexpr int kWaiters = 200;
  std::vector<WaitProbe> probes(kWaiters);
  std::thread waiters([&] {
    for (int i = 0; i < kWaiters; ++i) {
      // Half wait on a key that comes, half on one that never does.
      store.waitAsync(s, {i % 2 ? "comes" : "never"}, kT0 + 1s, probes[i].callback());
    }
  });
  std::thread setter([&] {
    for (int i = 0; i < 50; ++i) store.set(s, "comes", std::to_string(i));
  });
  waiters.join();
  setter.join();
  store.expire(kT0 + 1s);
  for (int i = 0; i < kWaiters; ++i) {
    INFO("waiter " << i);
    CHECK(probes[i].calls == 1);
    CHECK(probes[i].satisfied == (i % 2 == 1));
  }
}

TEST_CASE("limits: a run's bytes and keys are capped, and the refusal names the limit", "[store][limits]") {
  ddprun::RunScopedStoreOptions o;
  o.maxBytesPerRun = 100;
  o.maxKeysPerRun = 3;
  RunScopedStore store(o);
  const StoreScope s{"job", 1};
  store.set(s, "a", std::string(40, 'x'));  // 41 bytes
  store.set(s, "b", std::string(40, 'x'));  // 82
  CHECK_THROWS_MATCHES(store.set(s, "c", std::string(40, 'x')), ddprun::CapacityError,
                       Catch::Matchers::Predicate<ddprun::CapacityError>([](const auto& e) {
                         return std::string(e.what()).find("run 'job' (bytes)") != std::string::npos;
                       }));
  CHECK_FALSE(store.get(s, "c").has_value());  // nothing changed
  store.set(s, "a", std::string(10, 'x'));      // replacing with a smaller value frees room
  store.set(s, "c", std::string(40, 'x'));
  CHECK_THROWS_AS(store.add(s, "d", 1), ddprun::CapacityError);  // a fourth key
  CHECK_THROWS_AS(store.compareSet(s, "d", "", "v"), ddprun::CapacityError);  // and through compareSet
  CHECK(store.numKeys(s) == 3);
  CHECK(store.deleteKey(s, "c"));
  CHECK(store.add(s, "d", 1) == 1);  // a deleted key frees its room
  // Another round of the same run shares the run's budget; dropping rounds returns it.
  const StoreScope next{"job", 2};
  CHECK_THROWS_AS(store.set(next, "e", std::string(60, 'x')), ddprun::CapacityError);
  store.dropRoundsBefore("job", 2);
  store.set(next, "e", std::string(60, 'x'));
  // Other runs are not affected by this run's use.
  store.set({"other", 1}, "a", std::string(90, 'x'));
}

TEST_CASE("limits: every run together is capped, and dropping a run gives the room back", "[store][limits]") {
  ddprun::RunScopedStoreOptions o;
  o.maxBytesTotal = 100;
  o.maxKeysTotal = 4;
  RunScopedStore store(o);
  store.set({"a", 1}, "k", std::string(60, 'x'));
  CHECK_THROWS_WITH(store.set({"b", 1}, "k", std::string(60, 'x')), Catch::Contains("the server (bytes, every run)"));
  store.set({"b", 1}, "k1", "1");
  store.set({"b", 1}, "k2", "2");
  store.set({"b", 1}, "k3", "3");
  CHECK_THROWS_WITH(store.set({"c", 1}, "k", "v"), Catch::Contains("the server (keys, every run)"));
  store.dropRun("a");
  store.set({"c", 1}, "k", std::string(60, 'x'));
}

TEST_CASE("append, listKeys and compareSet's wasMissing", "[store]") {
  RunScopedStore store;
  const StoreScope s{"job", 1};
  WaitProbe probe;
  REQUIRE(store.waitAsync(s, {"ap"}, kT0 + 1h, probe.callback()));
  store.append(s, "ap", "po");  // creates the key: its waiter wakes
  CHECK(probe.calls == 1);
  CHECK(probe.satisfied);
  store.append(s, "ap", "tato");
  CHECK(store.get(s, "ap") == std::optional<std::string>("potato"));
  CHECK_THROWS_AS(store.append(s, "ap", std::string(RunScopedStore::kMaxValueBytes, 'x')), ddprun::ConfigError);
  CHECK(store.get(s, "ap") == std::optional<std::string>("potato"));
  store.set(StoreScope{"job", 2}, "other", "1");
  auto keys = store.listKeys(s);
  CHECK(keys == std::vector<std::string>{"ap"});
  bool missing = false;
  CHECK(store.compareSet(s, "cs", "exp", "x", &missing).empty());
  CHECK(missing);
  CHECK(store.compareSet(s, "ap", "potato", "y", &missing) == "y");
  CHECK_FALSE(missing);
}
