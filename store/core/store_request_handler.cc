#include "store/core/store_request_handler.h"

#include <chrono>
#include <utility>

#include "store/core/store_limits.h"
#include "store/core/store_ops.h"

namespace ddprun {

StoreRequestHandler::StoreRequestHandler(StoreCore& core, Respond respond)
    : core_(core), respond_(std::move(respond)) {}

void StoreRequestHandler::end() {
  std::vector<RunScopedStore::WaitId> armed;
  {
    std::lock_guard lock(mutex_);
    ending_ = true;
    armed = takeArmedLocked();
  }
  for (auto id : armed) core_.store().cancelWait(id);
}

void StoreRequestHandler::handle(v1::StoreRequest& request) {
  if (request.op_case() == v1::StoreRequest::kGet || request.op_case() == v1::StoreRequest::kWait) {
    handleBlocking(request);
    return;
  }
  v1::StoreResponse response;
  const StoreStatus status = runQuick(request, response);
  respond(std::move(response), status);
}

bool StoreRequestHandler::answerNow(v1::StoreRequest& request, v1::StoreResponse& response) {
  StoreStatus status;
  if (request.op_case() == v1::StoreRequest::kGet || request.op_case() == v1::StoreRequest::kWait) {
    PendingWait wait;
    if (!answerBlockingNow(request, wait, response, status)) {
      response.Clear();
      return false;
    }
  } else {
    status = runQuick(request, response);
  }
  if (!status.ok()) {
    response.clear_result();
    detail::setStatus(response, status);
  }
  return true;
}

StoreStatus StoreRequestHandler::runQuick(v1::StoreRequest& request, v1::StoreResponse& response) {
  response.set_id(request.id());
  try {
    return detail::runQuickOp(core_, request, response);
  } catch (...) {
    return StoreStatus::fromCurrentException();
  }
}

void StoreRequestHandler::handleBlocking(v1::StoreRequest& request) {
  PendingWait wait;
  v1::StoreResponse response;
  StoreStatus status;
  if (!answerBlockingNow(request, wait, response, status)) {
    addPending(std::move(wait));
    return;
  }
  respond(std::move(response), status);
}

bool StoreRequestHandler::answerBlockingNow(const v1::StoreRequest& request, PendingWait& wait,
                                            v1::StoreResponse& response, StoreStatus& status) const {
  wait.requestId = request.id();
  response.set_id(request.id());
  try {
    const v1::Scope* scope = nullptr;
    if (request.has_get()) {
      const auto& r = request.get();
      scope = &r.scope();
      wait.isGet = true;
      wait.keys = {r.key()};
      wait.timeoutMs = r.timeout_ms();
    } else {
      const auto& r = request.wait();
      scope = &r.scope();
      wait.keys.assign(r.keys().begin(), r.keys().end());
      wait.timeoutMs = r.timeout_ms();
    }
    wait.scope = detail::toScope(*scope);
    status = core_.roundStatus(wait.scope);
    if (status.ok()) {
      // The common case first: the keys exist, and no wait is registered at all.
      if (!fillSatisfied(wait, response)) {
        if (wait.timeoutMs > 0) {
          wait.deadline = RunScopedStore::Clock::now() + std::chrono::milliseconds(wait.timeoutMs);
          return false;
        }
        auto failure = core_.waitFailure(wait.scope, wait.keys, 0);
        if (failure) {
          status = *failure;
        } else if (!fillSatisfied(wait, response)) {  // set and deleted again meanwhile
          status = {StoreCode::kDeadlineExceeded,
                    "timed out after 0 ms waiting for store key(s) " + quoteKeys(wait.keys)};
        }
      }
    }
  } catch (...) {
    status = StoreStatus::fromCurrentException();
  }
  return true;
}

bool StoreRequestHandler::fillSatisfied(const PendingWait& wait, v1::StoreResponse& response) const {
  if (wait.isGet) {
    auto value = core_.store().get(wait.scope, wait.keys.front());
    if (!value) return false;
    response.mutable_get()->set_value(std::move(*value));
    return true;
  }
  if (!core_.store().check(wait.scope, wait.keys)) return false;
  response.mutable_wait();
  return true;
}

void StoreRequestHandler::addPending(PendingWait wait) {
  uint64_t slot = 0;
  const uint64_t requestId = wait.requestId;
  const StoreScope scope = wait.scope;
  std::vector<std::string> keys = wait.keys;
  const auto deadline = wait.deadline;
  {
    std::lock_guard lock(mutex_);
    if (ending_) return;
    if (pending_.size() < core_.options().maxPendingPerConnection) {
      slot = nextSlot_++;
      pending_.emplace(slot, std::move(wait));
    }
  }
  if (slot == 0) {
    v1::StoreResponse response;
    response.set_id(requestId);
    respond(std::move(response),
            {StoreCode::kResourceExhausted,
             "too many pending store waits on one session (limit " +
                 std::to_string(core_.options().maxPendingPerConnection) + ")"});
    return;
  }
  std::optional<RunScopedStore::WaitId> id;
  StoreStatus failure;
  try {
    // The callback may run inside this call (the keys arrived meanwhile) or on any thread.
    id = core_.store().waitAsync(scope, std::move(keys), deadline,
                                   [self = shared_from_this(), slot](bool ok) { self->waitDone(slot, ok); });
    if (!id) {
      failure = {StoreCode::kResourceExhausted,
                 "too many pending store waits for run '" + scope.runId + "'"};
    }
  } catch (...) {
    failure = StoreStatus::fromCurrentException();
  }
  bool cancelNow = false;
  {
    std::lock_guard lock(mutex_);
    auto it = pending_.find(slot);
    if (it == pending_.end()) return;  // its callback already answered it
    if (!failure.ok() || ending_) {
      cancelNow = ending_ && failure.ok();
      if (!cancelNow) pending_.erase(it);
    } else {
      it->second.waitId = id;
    }
  }
  if (!failure.ok()) {
    v1::StoreResponse response;
    response.set_id(requestId);
    respond(std::move(response), failure);
  } else if (cancelNow) {
    // The session ended while this wait was being registered: end() could not see its id.
    if (core_.store().cancelWait(*id)) {
      std::lock_guard lock(mutex_);
      pending_.erase(slot);
    }
  } else {
    core_.wakeTimer(deadline);
  }
}

void StoreRequestHandler::waitDone(uint64_t slot, bool satisfied) {
  PendingWait wait;
  {
    std::lock_guard lock(mutex_);
    auto it = pending_.find(slot);
    if (it == pending_.end()) return;  // the session ended and forgot it
    wait = std::move(it->second);
    pending_.erase(it);
  }
  v1::StoreResponse response;
  response.set_id(wait.requestId);
  StoreStatus status;
  try {
    if (!satisfied) {
      auto failure = core_.waitFailure(wait.scope, wait.keys, wait.timeoutMs);
      if (failure) status = *failure;
    }
    if (status.ok() && !fillSatisfied(wait, response)) {
      wait.waitId.reset();
      addPending(std::move(wait));  // a key was deleted between the wake-up and the read
      return;
    }
  } catch (...) {
    status = StoreStatus::fromCurrentException();
  }
  respond(std::move(response), status);
}

void StoreRequestHandler::respond(v1::StoreResponse response, const StoreStatus& status) {
  if (!status.ok()) {
    response.clear_result();
    detail::setStatus(response, status);
  }
  {
    std::lock_guard lock(mutex_);
    if (ending_) return;
  }
  respond_(std::move(response));
}

std::vector<RunScopedStore::WaitId> StoreRequestHandler::takeArmedLocked() {
  std::vector<RunScopedStore::WaitId> armed;
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->second.waitId) {
      armed.push_back(*it->second.waitId);
      it = pending_.erase(it);
    } else {
      ++it;  // being registered: addPending() sees ending_ and cancels it itself
    }
  }
  return armed;
}

}  // namespace ddprun
