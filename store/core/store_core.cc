#include "store/core/store_core.h"

#include <spdlog/spdlog.h>

#include "common/ids.h"
#include "common/secrets.h"
#include "store/core/store_limits.h"  // quoteKeys

namespace ddprun {

StoreCore::StoreCore(StoreCoreOptions options)
    : options_(std::move(options)), store_(options_.limits) {
  if (options_.driveDeadlines) timer_ = std::thread([this] { timerLoop(); });
}

StoreCore::~StoreCore() { shutdown(); }

void StoreCore::shutdown() {
  store_.close();  // fails every pending wait, whichever adapter made it
  {
    std::lock_guard lock(timerMutex_);
    stopping_ = true;
  }
  timerCv_.notify_all();
  if (timer_.joinable()) timer_.join();
}

bool StoreCore::acceptsToken(std::string_view token) const {
  return options_.token.empty() || constantTimeEquals(token, options_.token);
}

void StoreCore::logRefusedToken(std::string_view who) const {
  // Never log the token itself, not even the wrong one: it may be a near miss.
  if (auto held = refusalLog_.allow()) {
    spdlog::warn("store: refused {}: missing or wrong job token{}", who, heldBackNote(*held));
  }
}

StoreStatus StoreCore::roundStatus(const StoreScope& scope) const {
  // Checked first, so that no later message can echo an unbounded run id.
  if (auto problem = idProblem(scope.runId)) return {StoreCode::kInvalidArgument, "run id " + *problem};
  if (options_.roundIsCurrent && !options_.roundIsCurrent(scope.runId, scope.round)) {
    if (options_.jobExists && !options_.jobExists(scope.runId)) {
      return {StoreCode::kFailedPrecondition,
              "no job '" + scope.runId + "' on this rendezvous server (none joined with that run id, or it is over)"};
    }
    return {StoreCode::kFailedPrecondition, "stale round " + std::to_string(scope.round) + " of run '" +
                                                scope.runId + "': the store serves only the job's current round"};
  }
  return {};
}

std::optional<StoreStatus> StoreCore::waitFailure(const StoreScope& scope, const std::vector<std::string>& keys,
                                                  uint32_t timeoutMs) const {
  if (store_.closed()) return StoreStatus(StoreCode::kUnavailable, "the store is closed");
  if (options_.roundIsCurrent && !options_.roundIsCurrent(scope.runId, scope.round)) {
    return StoreStatus(StoreCode::kFailedPrecondition, "stale round " + std::to_string(scope.round) + " of run '" +
                                                           scope.runId + "': the round ended while waiting");
  }
  const auto missing = store_.missing(scope, keys);
  if (missing.empty()) return std::nullopt;
  return StoreStatus(StoreCode::kDeadlineExceeded,
                     "timed out after " + std::to_string(timeoutMs) + " ms waiting for store key(s) " +
                         quoteKeys(missing) + " of run '" + scope.runId + "' round " + std::to_string(scope.round));
}

void StoreCore::wakeTimer(RunScopedStore::TimePoint deadline) {
  {
    std::lock_guard lock(timerMutex_);
    // The timer wakes by then anyway and sees this deadline: no need to wake it now (a store
    // answering thousands of waits a second would otherwise switch to the timer for each).
    // min(): the timer is reading the next deadline and may have missed this one.
    if (timerTarget_ != RunScopedStore::TimePoint::min() && deadline >= timerTarget_) return;
    ++timerGeneration_;
  }
  timerCv_.notify_all();
}

void StoreCore::timerLoop() {
  std::unique_lock lock(timerMutex_);
  while (!stopping_) {
    // Read the generation before the deadline, with the target at its minimum: a wait added in
    // between bumps the generation, so it is never missed.
    const uint64_t seen = timerGeneration_;
    timerTarget_ = RunScopedStore::TimePoint::min();
    lock.unlock();
    const auto next = store_.nextDeadline();
    lock.lock();
    const auto woken = [&] { return stopping_ || timerGeneration_ != seen; };
    timerTarget_ = next.value_or(RunScopedStore::TimePoint::max());
    if (next) {
      timerCv_.wait_until(lock, *next, woken);
    } else {
      timerCv_.wait(lock, woken);
    }
    if (stopping_) break;
    lock.unlock();
    store_.expire(RunScopedStore::Clock::now());
    lock.lock();
  }
}

}  // namespace ddprun
