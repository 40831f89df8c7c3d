// Fuzz target: every store request handler, in process, no network. A sequence of StoreRequests
// (built from the input, or parsed from raw bytes with ParseFromArray) goes through what a Session
// stream does with each (store_session.cc): runQuickOp for set/add/compare_set/check/delete/
// num_keys, the round check, the immediate read and the asynchronous wait for get/wait, waitFailure
// when a wait ends unsatisfied, setStatus for every error. Between requests: time passes (expire),
// a new round drops older ones, a run is dropped, a wait is cancelled, the store closes. The caps
// (bytes, keys, waiters, pending waits) are tiny, so every limit is hit.
//
// Properties, checked against a small model of the store (maps, no limits of its own):
// - every response has the status code the model predicts, and the result (value, counter, flag,
//   count) it predicts; a refused write names how much the store holds, and that figure equals the
//   model's, so the byte and key accounting never drifts or wraps below zero;
// - every wait is called back exactly once (satisfied when the model says so) unless cancelled,
//   and nextDeadline() is the earliest pending deadline;
// - every error message a client would see is at most kMaxErrorMessageBytes and printable ASCII,
//   before bounding too: no status echoes raw input.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <google/protobuf/stubs/logging.h>

#include "common/error_message.h"
#include "common/ids.h"
#include "common/strings.h"
#include "ddprun/v1/store.pb.h"
#include "store/core/run_scoped_store.h"
#include "store/core/store_core.h"
#include "store/core/store_ops.h"
#include "store/core/store_status.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

using ddprun::RunScopedStore;
using ddprun::StoreScope;
using ddprun::fuzz::FuzzInput;
namespace v1 = ddprun::v1;
using Code = ddprun::StoreCode;
using TimePoint = RunScopedStore::TimePoint;

bool printableAscii(const std::string& text) {
  return std::all_of(text.begin(), text.end(), [](char c) { return c >= 0x20 && c <= 0x7e; });
}

// c10d's counter format: the whole value a decimal int64.
std::optional<int64_t> counter(const std::string& text) {
  const bool negative = !text.empty() && text[0] == '-';
  std::size_t i = negative ? 1 : 0;
  if (i == text.size()) return std::nullopt;
  int64_t v = 0;
  for (; i < text.size(); ++i) {
    if (text[i] < '0' || text[i] > '9') return std::nullopt;
    const int digit = text[i] - '0';
    if (__builtin_mul_overflow(v, 10, &v) ||
        (negative ? __builtin_sub_overflow(v, digit, &v) : __builtin_add_overflow(v, digit, &v))) {
      return std::nullopt;
    }
  }
  return v;
}

bool keyOk(const std::string& key) { return !key.empty() && key.size() <= ddprun::kMaxStoreKeyBytes; }

// What the store should hold, and how much, without the store's code.
struct Model {
  struct Run {
    std::map<uint64_t, std::map<std::string, std::string>> rounds;
    std::size_t bytes = 0, keys = 0;
  };
  ddprun::RunScopedStoreOptions caps;
  std::map<std::string, Run> runs;
  std::size_t totalBytes = 0, totalKeys = 0;
  bool closed = false;

  const std::string* find(const StoreScope& s, const std::string& key) const {
    auto run = runs.find(s.runId);
    if (run == runs.end()) return nullptr;
    auto round = run->second.rounds.find(s.round);
    if (round == run->second.rounds.end()) return nullptr;
    auto it = round->second.find(key);
    return it == round->second.end() ? nullptr : &it->second;
  }
  // The refusal message's "holds N of at most L" when writing would pass a cap; nullopt if it fits.
  std::optional<std::string> refusal(const StoreScope& s, const std::string& key, std::size_t valueSize) const {
    const std::string* old = find(s, key);
    auto run = runs.find(s.runId);
    const std::size_t runBytes = run == runs.end() ? 0 : run->second.bytes;
    const std::size_t runKeys = run == runs.end() ? 0 : run->second.keys;
    const std::size_t oldCost = old ? key.size() + old->size() : 0, newCost = key.size() + valueSize;
    auto holds = [](std::size_t n, std::size_t l) { return "holds " + std::to_string(n) + " of at most " + std::to_string(l); };
    if (newCost > oldCost && runBytes + newCost - oldCost > caps.maxBytesPerRun) return holds(runBytes, caps.maxBytesPerRun);
    if (newCost > oldCost && totalBytes + newCost - oldCost > caps.maxBytesTotal) return holds(totalBytes, caps.maxBytesTotal);
    if (!old && runKeys + 1 > caps.maxKeysPerRun) return holds(runKeys, caps.maxKeysPerRun);
    if (!old && totalKeys + 1 > caps.maxKeysTotal) return holds(totalKeys, caps.maxKeysTotal);
    return std::nullopt;
  }
  void put(const StoreScope& s, const std::string& key, const std::string& value) {
    Run& run = runs[s.runId];
    auto& values = run.rounds[s.round];
    auto it = values.find(key);
    if (it != values.end()) {
      run.bytes -= key.size() + it->second.size();
      totalBytes -= key.size() + it->second.size();
    } else {
      ++run.keys;
      ++totalKeys;
    }
    values[key] = value;
    run.bytes += key.size() + value.size();
    totalBytes += key.size() + value.size();
  }
  bool erase(const StoreScope& s, const std::string& key) {
    if (!find(s, key)) return false;
    Run& run = runs[s.runId];
    auto& values = run.rounds[s.round];
    const std::size_t cost = key.size() + values[key].size();
    values.erase(key);
    run.bytes -= cost;
    totalBytes -= cost;
    --run.keys;
    --totalKeys;
    return true;
  }
  void dropRounds(const std::string& runId, std::optional<uint64_t> before) {
    auto run = runs.find(runId);
    if (run == runs.end()) return;
    for (auto it = run->second.rounds.begin(); it != run->second.rounds.end() && (!before || it->first < *before);) {
      for (const auto& [k, v] : it->second) {
        run->second.bytes -= k.size() + v.size();
        totalBytes -= k.size() + v.size();
      }
      run->second.keys -= it->second.size();
      totalKeys -= it->second.size();
      it = run->second.rounds.erase(it);
    }
    if (!before) runs.erase(run);
  }
  bool allPresent(const StoreScope& s, const std::vector<std::string>& keys) const {
    return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return find(s, k) != nullptr; });
  }
};

// A predicted response: its code, and for OK the result to compare; `detail` must be in the message.
struct Expected {
  Code code = Code::kOk;
  std::string detail;
};

struct PendingWait {
  uint64_t requestId = 0;
  bool isGet = false;
  StoreScope scope;
  std::vector<std::string> keys;
  uint32_t timeoutMs = 0;
  TimePoint deadline;
  RunScopedStore::WaitId storeId = 0;
};

class Harness {
 public:
  explicit Harness(FuzzInput& in) : in_(in) {
    model_.caps.maxWaitersPerRun = 1 + in.below(4);
    model_.caps.maxBytesPerRun = in.u16() % 8192;
    model_.caps.maxBytesTotal = in.u16() % 12288;
    model_.caps.maxKeysPerRun = in.below(8);
    model_.caps.maxKeysTotal = in.below(12);
    options_.maxPendingPerConnection = 1 + in.below(4);
    if (in.flag()) {  // as the rendezvous server: only a job's running round may use the store
      options_.roundIsCurrent = [this](const std::string& run, uint64_t round) { return isCurrent(run, round); };
    }
    options_.limits = model_.caps;
    options_.driveDeadlines = false;  // this harness drives time itself (expire with its own clock)
    core_.emplace(options_);
    store_ = &core_->store();
  }

  void run() {
    for (int steps = 0; !in_.empty() && steps < 200; ++steps) {
      const uint8_t action = in_.byte() % 16;
      if (action < 9) {
        v1::StoreRequest request = buildRequest();
        handle(request);
      } else if (action == 9) {
        v1::StoreRequest request;
        const std::string raw = in_.bytes(4096);
        if (request.ParseFromArray(raw.data(), static_cast<int>(raw.size()))) handle(request);
      } else if (action == 10 || action == 11) {
        static const std::vector<int64_t> steps = {0, 1, 10, 100, 1000, 60000};
        now_ += std::chrono::milliseconds(action == 10 ? in_.pick(steps) : in_.u16());
        expectFired(pendingWhere([&](const PendingWait& w) { return w.deadline <= now_; }),
                    [&] { store_->expire(now_); });
      } else if (action == 12) {  // the rendezvous started a round: older ones are dropped
        const std::string run = pickRun();
        const uint64_t round = pickRound();
        current_[run] = round;
        model_.dropRounds(run, round);
        expectFired(pendingWhere([&](const PendingWait& w) { return w.scope.runId == run && w.scope.round < round; }),
                    [&] { store_->dropRoundsBefore(run, round); });
      } else if (action == 13) {  // the job is gone
        const std::string run = pickRun();
        current_.erase(run);
        model_.dropRounds(run, std::nullopt);
        expectFired(pendingWhere([&](const PendingWait& w) { return w.scope.runId == run; }),
                    [&] { store_->dropRun(run); });
      } else if (action == 14) {  // the session ended, or its client cancelled: forget a wait
        const std::size_t n = in_.byte();
        RunScopedStore::WaitId id = n;
        if (!pending_.empty() && n < 200) {
          auto it = std::next(pending_.begin(), static_cast<long>(n % pending_.size()));
          id = it->second.storeId;
        }
        bool expected = false;
        for (auto it = pending_.begin(); it != pending_.end(); ++it) {
          if (it->second.storeId == id) {
            pending_.erase(it);
            expected = true;
            ++cancelled_;
            break;
          }
        }
        FUZZ_CHECK(store_->cancelWait(id) == expected, "cancelWait disagrees with the pending waits");
      } else if (in_.byte() == 0) {
        closeStore();
      }
      checkDeadline();
    }
    closeStore();
    for (const auto& [slot, n] : calls_) FUZZ_CHECK(n == 1, "a wait was called back " + std::to_string(n) + " times");
    FUZZ_CHECK(calls_.size() == accepted_ - cancelled_, "an accepted wait was never called back");
  }

 private:
  bool isCurrent(const std::string& run, uint64_t round) const {
    auto it = current_.find(run);
    return it != current_.end() && it->second == round;
  }

  std::string pickRun() {
    switch (in_.below(8)) {
      case 4: return in_.bytes(300);
      case 5: return std::string(ddprun::kMaxIdBytes, 'r');
      case 6: return std::string(ddprun::kMaxIdBytes + 1, 'r');
      case 7: return "bad id\n\x1b[31m";
      default: return in_.pick(std::vector<std::string>{"job", "job", "j2", "x"});
    }
  }
  uint64_t pickRound() {
    const std::size_t b = in_.below(6);
    return b < 4 ? b : (b == 4 ? in_.u64() : UINT64_MAX);
  }
  std::string pickKey() {
    switch (in_.below(8)) {
      case 4: return in_.bytes(64);
      case 5: {  // long, of arbitrary bytes, near the limit
        std::string piece = in_.bytes(255), key;
        while (!piece.empty() && key.size() + piece.size() <= ddprun::kMaxStoreKeyBytes) key += piece;
        return key;
      }
      case 6: return std::string(ddprun::kMaxStoreKeyBytes + (in_.flag() ? 1 : 0), 'K');
      case 7: return "";
      default: return in_.pick(std::vector<std::string>{"a", "b", "c", "n"});
    }
  }
  std::string pickValue() {
    switch (in_.below(6)) {
      case 0: return in_.bytes(64);
      case 1: return std::to_string(static_cast<int64_t>(in_.u64()));
      case 2: return "1";
      case 3: return std::string(in_.u16() % 2048, 'v');
      case 4: return "";
      default: return "9223372036854775807";
    }
  }
  void fillScope(v1::Scope* scope) {
    scope->set_run_id(pickRun());
    scope->set_round(pickRound());
  }

  v1::StoreRequest buildRequest() {
    v1::StoreRequest r;
    r.set_id(in_.u16());
    switch (in_.below(8)) {
      case 0: {
        auto* m = r.mutable_set();
        fillScope(m->mutable_scope());
        m->set_key(pickKey());
        m->set_value(pickValue());
        break;
      }
      case 1: {
        auto* m = r.mutable_get();
        fillScope(m->mutable_scope());
        m->set_key(pickKey());
        m->set_timeout_ms(in_.flag() ? 0 : in_.u16());
        break;
      }
      case 2: {
        auto* m = r.mutable_add();
        fillScope(m->mutable_scope());
        m->set_key(pickKey());
        m->set_delta(in_.flag() ? static_cast<int64_t>(in_.byte()) - 128 : static_cast<int64_t>(in_.u64()));
        break;
      }
      case 3: {
        auto* m = r.mutable_compare_set();
        fillScope(m->mutable_scope());
        m->set_key(pickKey());
        m->set_expected(in_.flag() ? std::string() : pickValue());
        m->set_desired(pickValue());
        break;
      }
      case 4: {
        auto* m = r.mutable_wait();
        fillScope(m->mutable_scope());
        for (std::size_t n = in_.below(12); n > 0; --n) m->add_keys(pickKey());
        m->set_timeout_ms(in_.flag() ? 0 : in_.u16());
        break;
      }
      case 5: {
        auto* m = r.mutable_check();
        fillScope(m->mutable_scope());
        for (std::size_t n = in_.below(12); n > 0; --n) m->add_keys(pickKey());
        break;
      }
      case 6: {
        auto* m = r.mutable_delete_key();
        fillScope(m->mutable_scope());
        m->set_key(pickKey());
        break;
      }
      default:
        fillScope(r.mutable_num_keys()->mutable_scope());
        break;
    }
    return r;
  }

  // The round check every request passes first (roundStatus).
  std::optional<Expected> admit(const v1::Scope& scope) const {
    if (ddprun::idProblem(scope.run_id())) return Expected{Code::kInvalidArgument, "run id"};
    if (options_.roundIsCurrent && !isCurrent(scope.run_id(), scope.round())) {
      return Expected{Code::kFailedPrecondition, "stale round"};
    }
    return std::nullopt;
  }

  static StoreScope scopeOf(const v1::Scope& s) { return {s.run_id(), s.round()}; }

  // Predicts a write of `value` under `key` and applies it to the model when it succeeds.
  std::optional<Expected> write(const StoreScope& s, const std::string& key, const std::string& value) {
    if (auto refused = model_.refusal(s, key, value.size())) return Expected{Code::kResourceExhausted, *refused};
    model_.put(s, key, value);
    writtenScope_ = s;
    writtenKey_ = key;
    return std::nullopt;
  }

  // Predicts a quick operation: its outcome, the result it must carry, and the model's new state.
  Expected predictQuick(const v1::StoreRequest& r, v1::StoreResponse& result) {
    const auto closed = Expected{Code::kUnavailable, "closed"};
    const auto badKey = Expected{Code::kInvalidArgument, "store key"};
    switch (r.op_case()) {
      case v1::StoreRequest::kSet: {
        const auto& m = r.set();
        if (auto e = admit(m.scope())) return *e;
        if (!keyOk(m.key())) return badKey;
        if (model_.closed) return closed;
        if (auto e = write(scopeOf(m.scope()), m.key(), m.value())) return *e;
        result.mutable_set();
        return {};
      }
      case v1::StoreRequest::kAdd: {
        const auto& m = r.add();
        if (auto e = admit(m.scope())) return *e;
        if (!keyOk(m.key())) return badKey;
        if (model_.closed) return closed;
        int64_t value = 0;
        if (const std::string* old = model_.find(scopeOf(m.scope()), m.key())) {
          auto parsed = counter(*old);
          if (!parsed) return {Code::kFailedPrecondition, "does not hold an integer"};
          value = *parsed;
        }
        if (__builtin_add_overflow(value, m.delta(), &value)) return {Code::kFailedPrecondition, "overflows"};
        if (auto e = write(scopeOf(m.scope()), m.key(), std::to_string(value))) return *e;
        result.mutable_add()->set_value(value);
        return {};
      }
      case v1::StoreRequest::kCompareSet: {
        const auto& m = r.compare_set();
        if (auto e = admit(m.scope())) return *e;
        if (!keyOk(m.key())) return badKey;
        if (model_.closed) return closed;
        const StoreScope s = scopeOf(m.scope());
        const std::string* old = model_.find(s, m.key());
        std::string after = old ? *old : "";
        if ((!old && m.expected().empty()) || (old && *old == m.expected())) {
          if (auto e = write(s, m.key(), m.desired())) return *e;
          after = m.desired();
        }
        result.mutable_compare_set()->set_value(after);
        result.mutable_compare_set()->set_key_was_missing(old == nullptr);
        return {};
      }
      case v1::StoreRequest::kCheck: {
        const auto& m = r.check();
        if (auto e = admit(m.scope())) return *e;
        for (const auto& key : m.keys()) {
          if (!keyOk(key)) return badKey;
        }
        if (model_.closed) return closed;
        result.mutable_check()->set_all_present(
            model_.allPresent(scopeOf(m.scope()), {m.keys().begin(), m.keys().end()}));
        return {};
      }
      case v1::StoreRequest::kDeleteKey: {
        const auto& m = r.delete_key();
        if (auto e = admit(m.scope())) return *e;
        if (!keyOk(m.key())) return badKey;
        if (model_.closed) return closed;
        result.mutable_delete_key()->set_deleted(model_.erase(scopeOf(m.scope()), m.key()));
        return {};
      }
      case v1::StoreRequest::kNumKeys: {
        const auto& m = r.num_keys();
        if (auto e = admit(m.scope())) return *e;
        if (model_.closed) return closed;
        auto run = model_.runs.find(m.scope().run_id());
        int64_t count = 0;
        if (run != model_.runs.end() && run->second.rounds.count(m.scope().round())) {
          count = static_cast<int64_t>(run->second.rounds.at(m.scope().round()).size());
        }
        result.mutable_num_keys()->set_count(count);
        return {};
      }
      default:
        return {Code::kInvalidArgument, "names no operation"};
    }
  }

  // A response as the client receives it: the status set through setStatus, checked against the
  // prediction and the bounds on messages.
  void checkResponse(const char* what, const ddprun::StoreStatus& status, v1::StoreResponse& response,
                     const Expected& expected, const v1::StoreResponse& expectedResult) {
    const std::string context = std::string(what) + ": got " + std::to_string(static_cast<int>(status.code)) + " '" +
                                ddprun::printable(status.message, 200) + "', expected " +
                                std::to_string(static_cast<int>(expected.code)) + " '" + ddprun::printable(expected.detail, 200) + "'";
    FUZZ_CHECK(status.code == expected.code, context);
    FUZZ_CHECK(status.message.find(expected.detail) != std::string::npos, context);
    FUZZ_CHECK(printableAscii(status.message), std::string(what) + ": a status message echoes raw bytes: '" +
                                                           ddprun::printable(status.message, 300) + "'");
    if (!status.ok()) {
      response.clear_result();
      ddprun::detail::setStatus(response, status);
      FUZZ_CHECK(response.status().message().size() <= ddprun::kMaxErrorMessageBytes,
                 std::string(what) + ": an error message of " + std::to_string(response.status().message().size()) +
                     " bytes");
      FUZZ_CHECK(response.status().code() == static_cast<int32_t>(expected.code), context);
      return;
    }
    FUZZ_CHECK(!response.has_status(), context);
    FUZZ_CHECK(response.SerializeAsString() == expectedResult.SerializeAsString(),
               std::string(what) + ": result differs from the model's: " + response.ShortDebugString() + " vs " +
                   expectedResult.ShortDebugString());
  }

  void handle(v1::StoreRequest& request) {
    if (request.op_case() == v1::StoreRequest::kGet || request.op_case() == v1::StoreRequest::kWait) {
      handleBlocking(request);
      return;
    }
    v1::StoreResponse expectedResult;
    expectedResult.set_id(request.id());
    writtenKey_.reset();
    const Expected expected = predictQuick(request, expectedResult);
    std::vector<std::pair<uint64_t, bool>> due;
    if (writtenKey_) due = satisfiedBy(*writtenScope_, *writtenKey_);
    v1::StoreResponse response;
    response.set_id(request.id());
    ddprun::StoreStatus status;
    fired_.clear();
    try {
      status = ddprun::detail::runQuickOp(*core_, request, response);
    } catch (...) {
      status = ddprun::StoreStatus::fromCurrentException();
    }
    checkResponse("quick op", status, response, expected, expectedResult);
    settle(due);
  }

  // Get and Wait, as StoreSession::handleBlocking does them.
  void handleBlocking(const v1::StoreRequest& request) {
    PendingWait wait;
    wait.requestId = request.id();
    const v1::Scope& scope = request.has_get() ? request.get().scope() : request.wait().scope();
    if (request.has_get()) {
      wait.isGet = true;
      wait.keys = {request.get().key()};
      wait.timeoutMs = request.get().timeout_ms();
    } else {
      wait.keys.assign(request.wait().keys().begin(), request.wait().keys().end());
      wait.timeoutMs = request.wait().timeout_ms();
    }
    wait.scope = scopeOf(scope);

    Expected expected;
    v1::StoreResponse expectedResult;
    expectedResult.set_id(request.id());
    bool expectPending = false;
    if (auto e = admit(scope)) {
      expected = *e;
    } else if (!std::all_of(wait.keys.begin(), wait.keys.end(), keyOk)) {
      expected = {Code::kInvalidArgument, "store key"};
    } else if (model_.closed) {
      expected = {Code::kUnavailable, "closed"};
    } else if (model_.allPresent(wait.scope, wait.keys)) {
      fillExpected(wait, expectedResult);
    } else if (wait.timeoutMs == 0) {
      expected = {Code::kDeadlineExceeded, "timed out after 0 ms"};
    } else if (pending_.size() >= options_.maxPendingPerConnection) {
      expected = {Code::kResourceExhausted, "too many pending store waits on one session"};
    } else if (waitersOf(wait.scope.runId) >= model_.caps.maxWaitersPerRun) {
      expected = {Code::kResourceExhausted, "too many pending store waits for run"};
    } else {
      expectPending = true;
    }

    v1::StoreResponse response;
    response.set_id(request.id());
    ddprun::StoreStatus status;
    bool pendingNow = false;
    fired_.clear();
    try {
      status = core_->roundStatus(ddprun::detail::toScope(scope));
      if (status.ok() && !fill(wait, response)) {
        if (wait.timeoutMs > 0) {
          pendingNow = addPending(wait, status);
        } else if (auto failure = core_->waitFailure(wait.scope, wait.keys, 0)) {
          status = *failure;
        } else {
          ddprun::fuzz::fail(__FILE__, __LINE__, "waitFailure found every key that fill() missed");
        }
      }
    } catch (...) {
      status = ddprun::StoreStatus::fromCurrentException();
    }
    FUZZ_CHECK(fired_.empty(), "a wait was called back while it was being registered");
    FUZZ_CHECK(pendingNow == expectPending, "a get/wait was queued (or not) unlike the model predicts");
    if (!pendingNow) checkResponse("get/wait", status, response, expected, expectedResult);
  }

  bool fill(const PendingWait& wait, v1::StoreResponse& response) const {
    if (wait.isGet) {
      auto value = store_->get(wait.scope, wait.keys.front());
      if (!value) return false;
      response.mutable_get()->set_value(*value);
      return true;
    }
    if (!store_->check(wait.scope, wait.keys)) return false;
    response.mutable_wait();
    return true;
  }
  void fillExpected(const PendingWait& wait, v1::StoreResponse& result) const {
    if (wait.isGet) {
      result.mutable_get()->set_value(*model_.find(wait.scope, wait.keys.front()));
    } else {
      result.mutable_wait();
    }
  }

  // StoreSession::addPending: true when the wait is now pending, else `status` says why not.
  bool addPending(PendingWait wait, ddprun::StoreStatus& status) {
    if (pending_.size() >= options_.maxPendingPerConnection) {
      status = {Code::kResourceExhausted, "too many pending store waits on one session (limit " +
                                              std::to_string(options_.maxPendingPerConnection) + ")"};
      return false;
    }
    const uint64_t slot = nextSlot_++;
    wait.deadline = now_ + std::chrono::milliseconds(wait.timeoutMs);
    auto id = store_->waitAsync(wait.scope, wait.keys, wait.deadline, [this, slot](bool ok) {
      fired_.emplace_back(slot, ok);
      ++calls_[slot];
    });
    if (!id) {
      status = {Code::kResourceExhausted, "too many pending store waits for run '" + wait.scope.runId + "'"};
      return false;
    }
    ++accepted_;
    wait.storeId = *id;
    pending_.emplace(slot, std::move(wait));
    return true;
  }

  std::size_t waitersOf(const std::string& runId) const {
    return static_cast<std::size_t>(std::count_if(pending_.begin(), pending_.end(),
                                                  [&](const auto& p) { return p.second.scope.runId == runId; }));
  }

  template <typename Pred>
  std::vector<std::pair<uint64_t, bool>> pendingWhere(Pred pred) const {
    std::vector<std::pair<uint64_t, bool>> out;
    for (const auto& [slot, w] : pending_) {
      if (pred(w)) out.emplace_back(slot, false);
    }
    return out;
  }
  // The waits a successful write of `key` completes: those on it whose keys now all exist.
  std::vector<std::pair<uint64_t, bool>> satisfiedBy(const StoreScope& s, const std::string& key) const {
    std::vector<std::pair<uint64_t, bool>> out;
    for (const auto& [slot, w] : pending_) {
      if (w.scope.runId == s.runId && w.scope.round == s.round &&
          std::find(w.keys.begin(), w.keys.end(), key) != w.keys.end() && model_.allPresent(s, w.keys)) {
        out.emplace_back(slot, true);
      }
    }
    return out;
  }

  // Runs a store call that may call waits back; exactly `due` must be.
  template <typename Action>
  void expectFired(std::vector<std::pair<uint64_t, bool>> due, Action action) {
    fired_.clear();
    action();
    settle(due);
  }

  // Checks that exactly the `due` waits were called back, then answers each as
  // StoreSession::waitDone does and checks the answer.
  void settle(std::vector<std::pair<uint64_t, bool>> due) {
    auto fired = fired_;
    fired_.clear();
    std::sort(due.begin(), due.end());
    std::sort(fired.begin(), fired.end());
    FUZZ_CHECK(fired == due, "the store called back " + std::to_string(fired.size()) + " wait(s), the model expected " +
                                 std::to_string(due.size()));
    for (const auto& [slot, satisfied] : fired) {
      PendingWait wait = std::move(pending_.at(slot));
      pending_.erase(slot);
      Expected expected;
      v1::StoreResponse expectedResult;
      expectedResult.set_id(wait.requestId);
      if (satisfied) {
        fillExpected(wait, expectedResult);
      } else if (model_.closed) {
        expected = {Code::kUnavailable, "closed"};
      } else if (options_.roundIsCurrent && !isCurrent(wait.scope.runId, wait.scope.round)) {
        expected = {Code::kFailedPrecondition, "stale round"};
      } else {
        FUZZ_CHECK(!model_.allPresent(wait.scope, wait.keys), "a wait failed with every key present");
        expected = {Code::kDeadlineExceeded, "timed out after " + std::to_string(wait.timeoutMs) + " ms"};
      }
      v1::StoreResponse response;
      response.set_id(wait.requestId);
      ddprun::StoreStatus status;
      try {
        if (!satisfied) {
          if (auto failure = core_->waitFailure(wait.scope, wait.keys, wait.timeoutMs)) {
            status = *failure;
          }
        }
        if (status.ok()) FUZZ_CHECK(fill(wait, response), "a completed wait cannot read its keys");
      } catch (...) {
        status = ddprun::StoreStatus::fromCurrentException();
      }
      checkResponse("wait completion", status, response, expected, expectedResult);
    }
  }

  void checkDeadline() const {
    std::optional<TimePoint> earliest;
    for (const auto& [slot, w] : pending_) {
      if (!earliest || w.deadline < *earliest) earliest = w.deadline;
    }
    FUZZ_CHECK(store_->nextDeadline() == earliest, "nextDeadline() is not the earliest pending deadline");
  }

  void closeStore() {
    model_.closed = true;
    model_.runs.clear();
    model_.totalBytes = model_.totalKeys = 0;
    expectFired(pendingWhere([](const PendingWait&) { return true; }), [&] { store_->close(); });
    FUZZ_CHECK(pending_.empty(), "waits are pending after close()");
  }

  FuzzInput& in_;
  Model model_;
  ddprun::StoreCoreOptions options_;
  std::optional<ddprun::StoreCore> core_;
  RunScopedStore* store_ = nullptr;  // core_'s
  std::map<std::string, uint64_t> current_;
  TimePoint now_{};
  std::map<uint64_t, PendingWait> pending_;
  std::vector<std::pair<uint64_t, bool>> fired_;
  std::map<uint64_t, int> calls_;
  std::size_t accepted_ = 0;
  std::size_t cancelled_ = 0;
  uint64_t nextSlot_ = 1;
  std::optional<StoreScope> writtenScope_;
  std::optional<std::string> writtenKey_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  // Raw requests with invalid UTF-8 in string fields fail to parse, and protobuf logs each one.
  static const bool quiet = [] { return google::protobuf::SetLogHandler(nullptr) || true; }();
  (void)quiet;
  FuzzInput in(data, size);
  Harness harness(in);
  harness.run();
  return 0;
}
