// The workers' key-value store, in memory: what the Store gRPC service serves. Keys live in a
// scope, the job's run id and round (the path /run/<id>/round/<n>/<key>), so a group restarted
// into a new round never reads a value of the old one. Bytes in, bytes out, as gloo's and c10d's
// stores; add() keeps an int64 counter as decimal text, as c10d does.
//
// Thread-safe. Waiting is asynchronous, so that no thread blocks per waiter: waitAsync() calls
// back once the keys exist or once expire() passes its deadline. The owner drives time through
// expire()/nextDeadline(), so tests use a fake time and the service a small timer thread.
#pragma once

#include <array>
#include <atomic>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "store/core/store_limits.h"

namespace ddprun {

// Which job and round a key belongs to.
struct StoreScope {
  std::string runId;
  uint64_t round = 0;
};

// Bounds on what the store holds, so that one job (or a client that is not one) cannot take the
// server's memory: a write past one is refused with CapacityError (RESOURCE_EXHAUSTED) naming it.
// A key's cost is its key plus its value. The defaults leave a real job's bootstrap (ids and
// addresses, a few KB per rank) several orders of magnitude of room.
struct RunScopedStoreOptions {
  // Pending waiters one run may hold.
  std::size_t maxWaitersPerRun = 65536;
  std::size_t maxBytesPerRun = std::size_t{256} << 20;  // 256 MiB
  std::size_t maxKeysPerRun = 100000;
  std::size_t maxBytesTotal = std::size_t{1} << 30;  // 1 GiB, every run together
  std::size_t maxKeysTotal = 1000000;
};

// The store's operations, as its metrics count them (ddprun_store_operations_total{op}).
enum class StoreOp { kSet, kGet, kAdd, kCompareSet, kCheck, kDelete, kNumKeys, kWait, kAppend, kListKeys, kCount };
const char* storeOpName(StoreOp op);

class RunScopedStore {
 public:
  // What the store holds and has done, for the daemon's metrics: a snapshot, cheap to take.
  struct Stats {
    std::size_t keys = 0;
    std::size_t bytes = 0;
    std::size_t runs = 0;
    std::size_t waits = 0;  // pending
    // By StoreOp: calls, and the time they spent in the store (under its lock and around it, not
    // in gRPC): rate(seconds) / rate(calls) is the store's own latency per call.
    std::array<uint64_t, static_cast<std::size_t>(StoreOp::kCount)> operations{};
    std::array<uint64_t, static_cast<std::size_t>(StoreOp::kCount)> nanos{};
  };
  Stats stats() const;

  using Clock = std::chrono::steady_clock;
  using TimePoint = Clock::time_point;
  using WaitId = uint64_t;
  // Called exactly once per accepted wait: true when every key exists, false when the deadline
  // passed, the round was dropped or the store closed. Must not throw.
  using WaitCallback = std::function<void(bool satisfied)>;

  static constexpr std::size_t kMaxKeyBytes = kMaxStoreKeyBytes;
  static constexpr std::size_t kMaxValueBytes = kMaxStoreValueBytes;

  explicit RunScopedStore(RunScopedStoreOptions options = {});
  RunScopedStore(const RunScopedStore&) = delete;
  RunScopedStore& operator=(const RunScopedStore&) = delete;

  // Every operation throws ConfigError for an empty or oversized key, an oversized run id or
  // value, and ClosedError once close() was called.
  void set(const StoreScope& scope, const std::string& key, std::string value);
  // Does not wait: nullopt when the key is missing.
  std::optional<std::string> get(const StoreScope& scope, const std::string& key) const;
  // Adds delta to the counter (a missing key counts as 0) and returns the new value. Throws
  // StateError when the key holds something other than a decimal int64, or on overflow.
  int64_t add(const StoreScope& scope, const std::string& key, int64_t delta);
  // Sets desired when the key holds expected, or is missing and expected is empty. Returns the
  // value after the call; a missing key reads as empty (c10d returns `expected` there instead).
  // `wasMissing`, when given, tells whether the key was missing before the call.
  std::string compareSet(const StoreScope& scope, const std::string& key,
                         const std::string& expected, std::string desired, bool* wasMissing = nullptr);
  // Appends `value` to the key's value; a missing key is created with it (and its waiters woken).
  // ConfigError when the result would be over kMaxValueBytes.
  void append(const StoreScope& scope, const std::string& key, const std::string& value);
  // The keys of the scope, in no particular order.
  std::vector<std::string> listKeys(const StoreScope& scope) const;
  bool check(const StoreScope& scope, const std::vector<std::string>& keys) const;
  // The keys of `keys` that do not exist, in order: what a timeout message names.
  std::vector<std::string> missing(const StoreScope& scope, const std::vector<std::string>& keys) const;
  bool deleteKey(const StoreScope& scope, const std::string& key);
  int64_t numKeys(const StoreScope& scope) const;

  // Calls `callback` once every key exists, or with false once expire() reaches `deadline`.
  // It runs on the thread that completes the wait, never under the store's lock: inside this call
  // when the keys already exist, inside another thread's set/add/compareSet that creates the last
  // key, or inside expire(), dropRoundsBefore(), dropRun() or close().
  // Returns the id for cancelWait(), or nullopt (the callback never runs) when the run already
  // has maxWaitersPerRun pending waiters.
  std::optional<WaitId> waitAsync(const StoreScope& scope, std::vector<std::string> keys,
                                  TimePoint deadline, WaitCallback callback);
  // Forgets a pending wait without calling it back. True when this call removed it (its callback
  // will never run); false when it already ran, is running, or the id is unknown.
  bool cancelWait(WaitId id);

  // Calls back (false) every wait whose deadline is <= now.
  void expire(TimePoint now);
  // The earliest deadline of a pending wait, for the owner's timer.
  std::optional<TimePoint> nextDeadline() const;

  // Frees the keys of the run's rounds older than `round`; their waits fail.
  void dropRoundsBefore(const std::string& runId, uint64_t round);
  // Frees everything of the run; its waits fail.
  void dropRun(const std::string& runId);
  // Fails every pending wait and refuses every later call with ClosedError. Idempotent.
  void close();
  bool closed() const;

 private:
  struct Round {
    std::unordered_map<std::string, std::string> values;
    std::size_t bytes = 0;  // keys plus values
    // Pending waits by the keys they wait for, so that a set wakes only its own waiters.
    std::unordered_map<std::string, std::unordered_set<WaitId>> watchers;
  };
  struct Run {
    std::map<uint64_t, Round> rounds;
    std::size_t waiters = 0;
    std::size_t bytes = 0;
    std::size_t keys = 0;
  };
  struct Waiter {
    StoreScope scope;
    std::vector<std::string> keys;
    TimePoint deadline;
    WaitCallback callback;
  };
  // Callbacks taken out under the lock, run after it is released.
  using Completions = std::vector<std::pair<WaitCallback, bool>>;

  void checkOpen() const;
  // Stores `value` under `key`, within the limits (CapacityError otherwise, nothing changed).
  // `run` is the scope's run, `r` its round.
  void put(const StoreScope& scope, Run& run, Round& r, const std::string& key, std::string value);
  // Forgets a round's keys in every count.
  void uncount(Run& run, const Round& r);
  const Round* findRound(const StoreScope& scope) const;
  Round& round(const StoreScope& scope);
  bool allPresent(const Round& round, const std::vector<std::string>& keys) const;
  // Completes the watchers of `key` whose keys now all exist.
  void keyCreated(Round& round, const std::string& key, Completions& out);
  // Removes a pending waiter from every index and hands its callback to `out`.
  void finishWaiter(WaitId id, bool satisfied, Completions& out);
  void failWaitersOf(const Round& round, Completions& out);
  static void runCompletions(Completions& completions);

  const RunScopedStoreOptions options_;
  mutable std::mutex mutex_;
  std::unordered_map<std::string, Run> runs_;
  std::size_t totalBytes_ = 0;
  std::size_t totalKeys_ = 0;
  std::unordered_map<WaitId, Waiter> waiters_;
  std::set<std::pair<TimePoint, WaitId>> deadlines_;
  WaitId nextWaitId_ = 1;
  bool closed_ = false;
  // Stats::operations and nanos, counted outside the lock.
  class OpTimer;
  mutable std::array<std::atomic<uint64_t>, static_cast<std::size_t>(StoreOp::kCount)> opCount_{};
  mutable std::array<std::atomic<uint64_t>, static_cast<std::size_t>(StoreOp::kCount)> opNanos_{};
};

}  // namespace ddprun
