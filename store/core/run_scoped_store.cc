#include "store/core/run_scoped_store.h"

#include <spdlog/spdlog.h>

#include <charconv>
#include <exception>

#include "common/error.h"
#include "common/store_prefix.h"
#include "common/strings.h"

namespace ddprun {

const char* storeOpName(StoreOp op) {
  switch (op) {
    case StoreOp::kSet: return "set";
    case StoreOp::kGet: return "get";
    case StoreOp::kAdd: return "add";
    case StoreOp::kCompareSet: return "compare_set";
    case StoreOp::kCheck: return "check";
    case StoreOp::kDelete: return "delete";
    case StoreOp::kNumKeys: return "num_keys";
    case StoreOp::kWait: return "wait";
    case StoreOp::kAppend: return "append";
    case StoreOp::kListKeys: return "list_keys";
    case StoreOp::kCount: break;
  }
  return "unknown";
}

// Counts one call and its time, whichever way it leaves (a refusal counts too).
class RunScopedStore::OpTimer {
 public:
  OpTimer(const RunScopedStore& store, StoreOp op)
      : store_(store), op_(static_cast<std::size_t>(op)), start_(Clock::now()) {}
  ~OpTimer() {
    const auto took = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start_).count();
    store_.opCount_[op_].fetch_add(1, std::memory_order_relaxed);
    store_.opNanos_[op_].fetch_add(static_cast<uint64_t>(took), std::memory_order_relaxed);
  }

 private:
  const RunScopedStore& store_;
  std::size_t op_;
  Clock::time_point start_;
};

RunScopedStore::Stats RunScopedStore::stats() const {
  Stats s;
  {
    std::lock_guard lock(mutex_);
    s.keys = totalKeys_;
    s.bytes = totalBytes_;
    s.runs = runs_.size();
    s.waits = waiters_.size();
  }
  for (std::size_t i = 0; i < s.operations.size(); ++i) {
    s.operations[i] = opCount_[i].load(std::memory_order_relaxed);
    s.nanos[i] = opNanos_[i].load(std::memory_order_relaxed);
  }
  return s;
}

namespace {

// The key cut and escaped, as every message naming a key: it is the client's bytes.
std::string describe(const StoreScope& scope, const std::string& key) {
  return storePrefix(scope.runId, scope.round) + printable(key, 64);
}

void validateScope(const StoreScope& scope) {
  if (scope.runId.size() > RunScopedStore::kMaxKeyBytes) {
    throw ConfigError("store run id is " + std::to_string(scope.runId.size()) + " bytes, more than " +
                      std::to_string(RunScopedStore::kMaxKeyBytes));
  }
}

void validateKeys(const std::vector<std::string>& keys) {
  for (const auto& key : keys) validateStoreKey(key);
}

// The whole text must be a decimal int64, as c10d's counters are; "12abc" is not 12.
std::optional<int64_t> parseCounter(const std::string& text) {
  int64_t value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || text.empty()) return std::nullopt;
  return value;
}

}  // namespace

RunScopedStore::RunScopedStore(RunScopedStoreOptions options) : options_(options) {}

void RunScopedStore::set(const StoreScope& scope, const std::string& key, std::string value) {
  OpTimer timer(*this, StoreOp::kSet);
  validateScope(scope);
  validateStoreKey(key);
  validateStoreValue(key, value);
  Completions done;
  {
    std::lock_guard lock(mutex_);
    checkOpen();
    Run& run = runs_[scope.runId];
    Round& r = run.rounds[scope.round];
    put(scope, run, r, key, std::move(value));
    keyCreated(r, key, done);
  }
  runCompletions(done);
}

std::optional<std::string> RunScopedStore::get(const StoreScope& scope, const std::string& key) const {
  OpTimer timer(*this, StoreOp::kGet);
  validateScope(scope);
  validateStoreKey(key);
  std::lock_guard lock(mutex_);
  checkOpen();
  const Round* r = findRound(scope);
  if (!r) return std::nullopt;
  auto it = r->values.find(key);
  if (it == r->values.end()) return std::nullopt;
  return it->second;
}

int64_t RunScopedStore::add(const StoreScope& scope, const std::string& key, int64_t delta) {
  OpTimer timer(*this, StoreOp::kAdd);
  validateScope(scope);
  validateStoreKey(key);
  Completions done;
  int64_t result = 0;
  {
    std::lock_guard lock(mutex_);
    checkOpen();
    Run& run = runs_[scope.runId];
    Round& r = run.rounds[scope.round];
    auto it = r.values.find(key);
    int64_t current = 0;
    if (it != r.values.end()) {
      auto parsed = parseCounter(it->second);
      if (!parsed) throw StateError("store key " + describe(scope, key) + " does not hold an integer");
      current = *parsed;
    }
    if (__builtin_add_overflow(current, delta, &result)) {
      throw StateError("adding " + std::to_string(delta) + " to store key " + describe(scope, key) +
                       " overflows int64");
    }
    put(scope, run, r, key, std::to_string(result));
    keyCreated(r, key, done);
  }
  runCompletions(done);
  return result;
}

std::string RunScopedStore::compareSet(const StoreScope& scope, const std::string& key,
                                    const std::string& expected, std::string desired, bool* wasMissing) {
  OpTimer timer(*this, StoreOp::kCompareSet);
  validateScope(scope);
  validateStoreKey(key);
  validateStoreValue(key, expected);
  validateStoreValue(key, desired);
  Completions done;
  std::string result;
  {
    std::lock_guard lock(mutex_);
    checkOpen();
    Run& run = runs_[scope.runId];
    Round& r = run.rounds[scope.round];
    auto it = r.values.find(key);
    if (wasMissing) *wasMissing = it == r.values.end();
    if (it == r.values.end()) {
      if (expected.empty()) {
        result = desired;
        put(scope, run, r, key, std::move(desired));
        keyCreated(r, key, done);
      }
    } else {
      if (it->second == expected) put(scope, run, r, key, std::move(desired));  // `it` stays valid
      result = it->second;
    }
  }
  runCompletions(done);
  return result;
}

bool RunScopedStore::check(const StoreScope& scope, const std::vector<std::string>& keys) const {
  OpTimer timer(*this, StoreOp::kCheck);
  return missing(scope, keys).empty();
}

std::vector<std::string> RunScopedStore::missing(const StoreScope& scope,
                                              const std::vector<std::string>& keys) const {
  validateScope(scope);
  validateKeys(keys);
  std::lock_guard lock(mutex_);
  checkOpen();
  const Round* r = findRound(scope);
  std::vector<std::string> out;
  for (const auto& key : keys) {
    if (!r || !r->values.contains(key)) out.push_back(key);
  }
  return out;
}

bool RunScopedStore::deleteKey(const StoreScope& scope, const std::string& key) {
  OpTimer timer(*this, StoreOp::kDelete);
  validateScope(scope);
  validateStoreKey(key);
  std::lock_guard lock(mutex_);
  checkOpen();
  auto run = runs_.find(scope.runId);
  if (run == runs_.end()) return false;
  auto r = run->second.rounds.find(scope.round);
  if (r == run->second.rounds.end()) return false;
  auto it = r->second.values.find(key);
  if (it == r->second.values.end()) return false;
  const std::size_t cost = it->first.size() + it->second.size();
  r->second.values.erase(it);
  r->second.bytes -= cost;
  run->second.bytes -= cost;
  run->second.keys -= 1;
  totalBytes_ -= cost;
  totalKeys_ -= 1;
  return true;
}

void RunScopedStore::append(const StoreScope& scope, const std::string& key, const std::string& value) {
  OpTimer timer(*this, StoreOp::kAppend);
  validateScope(scope);
  validateStoreKey(key);
  validateStoreValue(key, value);
  Completions done;
  {
    std::lock_guard lock(mutex_);
    checkOpen();
    Run& run = runs_[scope.runId];
    Round& r = run.rounds[scope.round];
    auto it = r.values.find(key);
    const bool created = it == r.values.end();
    std::string joined = created ? std::string() : it->second;
    if (joined.size() + value.size() > kMaxValueBytes) {
      throw ConfigError("appending " + std::to_string(value.size()) + " bytes to store key '" + printable(key, 64) +
                        "' would make it more than " + std::to_string(kMaxValueBytes) + " bytes");
    }
    joined += value;
    put(scope, run, r, key, std::move(joined));
    if (created) keyCreated(r, key, done);
  }
  runCompletions(done);
}

std::vector<std::string> RunScopedStore::listKeys(const StoreScope& scope) const {
  OpTimer timer(*this, StoreOp::kListKeys);
  validateScope(scope);
  std::lock_guard lock(mutex_);
  checkOpen();
  std::vector<std::string> keys;
  if (const Round* r = findRound(scope)) {
    keys.reserve(r->values.size());
    for (const auto& [key, value] : r->values) keys.push_back(key);
  }
  return keys;
}

int64_t RunScopedStore::numKeys(const StoreScope& scope) const {
  OpTimer timer(*this, StoreOp::kNumKeys);
  validateScope(scope);
  std::lock_guard lock(mutex_);
  checkOpen();
  const Round* r = findRound(scope);
  return r ? static_cast<int64_t>(r->values.size()) : 0;
}

std::optional<RunScopedStore::WaitId> RunScopedStore::waitAsync(const StoreScope& scope,
                                                          std::vector<std::string> keys,
                                                          TimePoint deadline, WaitCallback callback) {
  OpTimer timer(*this, StoreOp::kWait);
  validateScope(scope);
  validateKeys(keys);
  DDPRUN_CHECK(callback != nullptr, "waitAsync needs a callback");
  WaitId id = 0;
  {
    std::lock_guard lock(mutex_);
    checkOpen();
    id = nextWaitId_++;
    Round& r = round(scope);
    if (!allPresent(r, keys)) {
      Run& run = runs_[scope.runId];
      if (run.waiters >= options_.maxWaitersPerRun) return std::nullopt;
      ++run.waiters;
      for (const auto& key : keys) r.watchers[key].insert(id);
      deadlines_.emplace(deadline, id);
      waiters_.emplace(id, Waiter{scope, std::move(keys), deadline, std::move(callback)});
      return id;
    }
  }
  // Already satisfied: called back here, on the caller's thread, with no lock held.
  callback(true);
  return id;
}

bool RunScopedStore::cancelWait(WaitId id) {
  Completions dropped;
  {
    std::lock_guard lock(mutex_);
    if (!waiters_.contains(id)) return false;
    finishWaiter(id, false, dropped);
  }
  // The callback is destroyed here, outside the lock, and never called.
  return true;
}

void RunScopedStore::expire(TimePoint now) {
  Completions done;
  {
    std::lock_guard lock(mutex_);
    while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
      finishWaiter(deadlines_.begin()->second, false, done);
    }
  }
  runCompletions(done);
}

std::optional<RunScopedStore::TimePoint> RunScopedStore::nextDeadline() const {
  std::lock_guard lock(mutex_);
  if (deadlines_.empty()) return std::nullopt;
  return deadlines_.begin()->first;
}

void RunScopedStore::dropRoundsBefore(const std::string& runId, uint64_t round) {
  Completions done;
  {
    std::lock_guard lock(mutex_);
    auto run = runs_.find(runId);
    if (run == runs_.end()) return;
    auto& rounds = run->second.rounds;
    for (auto it = rounds.begin(); it != rounds.end() && it->first < round;) {
      failWaitersOf(it->second, done);
      uncount(run->second, it->second);
      it = rounds.erase(it);
    }
  }
  runCompletions(done);
}

void RunScopedStore::dropRun(const std::string& runId) {
  Completions done;
  {
    std::lock_guard lock(mutex_);
    auto run = runs_.find(runId);
    if (run == runs_.end()) return;
    for (auto& entry : run->second.rounds) {
      failWaitersOf(entry.second, done);
      uncount(run->second, entry.second);
    }
    runs_.erase(run);
  }
  runCompletions(done);
}

void RunScopedStore::close() {
  Completions done;
  {
    std::lock_guard lock(mutex_);
    closed_ = true;
    while (!waiters_.empty()) finishWaiter(waiters_.begin()->first, false, done);
    runs_.clear();
    totalBytes_ = totalKeys_ = 0;
  }
  runCompletions(done);
}

bool RunScopedStore::closed() const {
  std::lock_guard lock(mutex_);
  return closed_;
}

void RunScopedStore::checkOpen() const {
  if (closed_) throw ClosedError("the store is closed");
}

const RunScopedStore::Round* RunScopedStore::findRound(const StoreScope& scope) const {
  auto run = runs_.find(scope.runId);
  if (run == runs_.end()) return nullptr;
  auto r = run->second.rounds.find(scope.round);
  return r == run->second.rounds.end() ? nullptr : &r->second;
}

RunScopedStore::Round& RunScopedStore::round(const StoreScope& scope) {
  return runs_[scope.runId].rounds[scope.round];
}

void RunScopedStore::put(const StoreScope& scope, Run& run, Round& r, const std::string& key, std::string value) {
  auto it = r.values.find(key);
  const std::size_t oldCost = it == r.values.end() ? 0 : key.size() + it->second.size();
  const std::size_t newCost = key.size() + value.size();
  const std::size_t newKeys = it == r.values.end() ? 1 : 0;
  auto refuse = [&](const std::string& what, std::size_t used, std::size_t limit) {
    throw CapacityError("store full: " + what + " holds " + std::to_string(used) + " of at most " +
                        std::to_string(limit) + "; writing '" + printable(key, 64) + "' (" +
                        std::to_string(newCost) + " bytes) was refused");
  };
  if (newCost > oldCost) {
    const std::size_t more = newCost - oldCost;
    if (run.bytes + more > options_.maxBytesPerRun) refuse("run '" + scope.runId + "' (bytes)", run.bytes, options_.maxBytesPerRun);
    if (totalBytes_ + more > options_.maxBytesTotal) refuse("the server (bytes, every run)", totalBytes_, options_.maxBytesTotal);
  }
  if (newKeys) {
    if (run.keys + 1 > options_.maxKeysPerRun) refuse("run '" + scope.runId + "' (keys)", run.keys, options_.maxKeysPerRun);
    if (totalKeys_ + 1 > options_.maxKeysTotal) refuse("the server (keys, every run)", totalKeys_, options_.maxKeysTotal);
  }
  if (it == r.values.end()) {
    r.values.emplace(key, std::move(value));
  } else {
    it->second = std::move(value);
  }
  r.bytes = r.bytes - oldCost + newCost;
  run.bytes = run.bytes - oldCost + newCost;
  totalBytes_ = totalBytes_ - oldCost + newCost;
  run.keys += newKeys;
  totalKeys_ += newKeys;
}

void RunScopedStore::uncount(Run& run, const Round& r) {
  run.bytes -= r.bytes;
  run.keys -= r.values.size();
  totalBytes_ -= r.bytes;
  totalKeys_ -= r.values.size();
}

bool RunScopedStore::allPresent(const Round& r, const std::vector<std::string>& keys) const {
  for (const auto& key : keys) {
    if (!r.values.contains(key)) return false;
  }
  return true;
}

void RunScopedStore::keyCreated(Round& r, const std::string& key, Completions& out) {
  auto it = r.watchers.find(key);
  if (it == r.watchers.end()) return;
  std::vector<WaitId> ready;
  for (WaitId id : it->second) {
    if (allPresent(r, waiters_.at(id).keys)) ready.push_back(id);
  }
  for (WaitId id : ready) finishWaiter(id, true, out);
}

void RunScopedStore::finishWaiter(WaitId id, bool satisfied, Completions& out) {
  auto node = waiters_.extract(id);
  DDPRUN_CHECK(!node.empty(), "unknown store waiter");
  Waiter& w = node.mapped();
  deadlines_.erase({w.deadline, id});
  auto run = runs_.find(w.scope.runId);
  DDPRUN_CHECK(run != runs_.end(), "store waiter without its run");
  --run->second.waiters;
  auto r = run->second.rounds.find(w.scope.round);
  if (r != run->second.rounds.end()) {
    for (const auto& key : w.keys) {
      auto watchers = r->second.watchers.find(key);
      if (watchers == r->second.watchers.end()) continue;
      watchers->second.erase(id);
      if (watchers->second.empty()) r->second.watchers.erase(watchers);
    }
  }
  out.emplace_back(std::move(w.callback), satisfied);
}

void RunScopedStore::failWaitersOf(const Round& r, Completions& out) {
  // Ids first: finishing a waiter edits r.watchers.
  std::unordered_set<WaitId> ids;
  for (const auto& entry : r.watchers) ids.insert(entry.second.begin(), entry.second.end());
  for (WaitId id : ids) finishWaiter(id, false, out);
}

void RunScopedStore::runCompletions(Completions& completions) {
  for (auto& [callback, satisfied] : completions) {
    // A throwing callback must not take the other waiters' callbacks, or the caller's
    // already-applied write, down with it.
    try {
      callback(satisfied);
    } catch (const std::exception& e) {
      spdlog::error("store wait callback threw: {}", e.what());
    } catch (...) {
      spdlog::error("store wait callback threw a non-standard exception");
    }
  }
}

}  // namespace ddprun
