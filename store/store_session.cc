#include "store/store_session.h"

#include <chrono>
#include <utility>

#include "rpc/grpc_util.h"
#include "store/store_service.h"
#include "store/store_session_ops.h"

namespace ddprun {

namespace {

// Reading pauses while this much is queued for a client that does not read its answers.
constexpr std::size_t kMaxQueuedResponses = 256;
constexpr std::size_t kMaxQueuedBytes = 64 * 1024 * 1024;

}  // namespace

StoreSession::StoreSession(StoreService& service) : service_(service) {}

StoreSession* StoreSession::start(std::shared_ptr<StoreSession> session, const grpc::Status& admission) {
  StoreSession* raw = session.get();
  raw->self_ = std::move(session);
  if (!admission.ok()) {
    std::lock_guard lock(raw->mutex_);
    raw->finishLocked(admission);
  } else {
    raw->StartRead(&raw->request_);
  }
  return raw;
}

void StoreSession::end(const grpc::Status& status) {
  std::vector<RunScopedStore::WaitId> armed;
  {
    std::lock_guard lock(mutex_);
    if (ending_) return;
    armed = takeArmedLocked();
    finishLocked(status);
  }
  for (auto id : armed) service_.store_.cancelWait(id);
}

void StoreSession::OnReadDone(bool ok) {
  if (!ok) {
    // Half-closed (or gone: then OnCancel ends the session). Answer what is pending, then finish.
    std::lock_guard lock(mutex_);
    readsDone_ = true;
    finishIfIdleLocked();
    return;
  }
  handle(request_);
  std::lock_guard lock(mutex_);
  if (ending_) return;
  if (queueFullLocked()) {
    readPaused_ = true;  // OnWriteDone reads on once the client has taken some answers
  } else {
    StartRead(&request_);
  }
}

void StoreSession::OnWriteDone(bool ok) {
  std::vector<RunScopedStore::WaitId> armed;
  {
    std::lock_guard lock(mutex_);
    queuedBytes_ -= queue_.front().ByteSizeLong();
    queue_.pop_front();
    writing_ = false;
    if (!ok) {
      // The stream broke under the write: the client is gone.
      armed = takeArmedLocked();
      finishLocked({grpc::StatusCode::CANCELLED, "the store session's client is gone"});
    } else if (ending_) {
      finishLocked(grpc::Status::OK);  // the reason given when it started ending stands
    } else {
      if (!queue_.empty()) startWriteLocked();
      if (readPaused_ && !queueFullLocked()) {
        readPaused_ = false;
        StartRead(&request_);
      }
      finishIfIdleLocked();
    }
  }
  for (auto id : armed) service_.store_.cancelWait(id);
}

void StoreSession::OnCancel() { end({grpc::StatusCode::CANCELLED, "store session cancelled"}); }

void StoreSession::OnDone() {
  std::vector<RunScopedStore::WaitId> armed;
  {
    std::lock_guard lock(mutex_);
    ending_ = true;
    armed = takeArmedLocked();  // none is left in any way of ending, but never leak a wait
  }
  for (auto id : armed) service_.store_.cancelWait(id);
  service_.removeSession(this);
  auto last = std::move(self_);  // may delete this on return, unless a store callback holds it
}

void StoreSession::handle(v1::StoreRequest& request) {
  if (request.op_case() == v1::StoreRequest::kGet || request.op_case() == v1::StoreRequest::kWait) {
    handleBlocking(request);
    return;
  }
  v1::StoreResponse response;
  response.set_id(request.id());
  grpc::Status status;
  try {
    status = detail::runQuickOp(service_.store_, service_.options_, request, response);
  } catch (...) {
    status = detail::statusFromCurrentException();
  }
  respond(std::move(response), status);
}

void StoreSession::handleBlocking(v1::StoreRequest& request) {
  PendingWait wait;
  wait.requestId = request.id();
  v1::StoreResponse response;
  response.set_id(request.id());
  grpc::Status status;
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
    status = detail::roundStatus(service_.options_, *scope);
    if (status.ok()) {
      wait.scope = detail::toScope(*scope);
      // The common case first: the keys exist, and no wait is registered at all.
      if (!fillSatisfied(wait, response)) {
        if (wait.timeoutMs > 0) {
          wait.deadline = RunScopedStore::Clock::now() + std::chrono::milliseconds(wait.timeoutMs);
          addPending(std::move(wait));
          return;
        }
        auto failure = detail::waitFailure(service_.store_, service_.options_, wait.scope, wait.keys, 0);
        if (failure) {
          status = *failure;
        } else if (!fillSatisfied(wait, response)) {  // set and deleted again meanwhile
          status = {grpc::StatusCode::DEADLINE_EXCEEDED,
                    "timed out after 0 ms waiting for store key(s) " + quoteKeys(wait.keys)};
        }
      }
    }
  } catch (...) {
    status = detail::statusFromCurrentException();
  }
  respond(std::move(response), status);
}

bool StoreSession::fillSatisfied(const PendingWait& wait, v1::StoreResponse& response) const {
  if (wait.isGet) {
    auto value = service_.store_.get(wait.scope, wait.keys.front());
    if (!value) return false;
    response.mutable_get()->set_value(std::move(*value));
    return true;
  }
  if (!service_.store_.check(wait.scope, wait.keys)) return false;
  response.mutable_wait();
  return true;
}

void StoreSession::addPending(PendingWait wait) {
  uint64_t slot = 0;
  const uint64_t requestId = wait.requestId;
  const StoreScope scope = wait.scope;
  std::vector<std::string> keys = wait.keys;
  const auto deadline = wait.deadline;
  {
    std::lock_guard lock(mutex_);
    if (ending_) return;
    if (pending_.size() < service_.options_.maxPendingPerSession) {
      slot = nextSlot_++;
      pending_.emplace(slot, std::move(wait));
    }
  }
  if (slot == 0) {
    v1::StoreResponse response;
    response.set_id(requestId);
    respond(std::move(response),
            {grpc::StatusCode::RESOURCE_EXHAUSTED,
             "too many pending store waits on one session (limit " +
                 std::to_string(service_.options_.maxPendingPerSession) + ")"});
    return;
  }
  std::optional<RunScopedStore::WaitId> id;
  grpc::Status failure;
  try {
    // The callback may run inside this call (the keys arrived meanwhile) or on any thread.
    id = service_.store_.waitAsync(scope, std::move(keys), deadline,
                                   [self = shared_from_this(), slot](bool ok) { self->waitDone(slot, ok); });
    if (!id) {
      failure = {grpc::StatusCode::RESOURCE_EXHAUSTED,
                 "too many pending store waits for run '" + scope.runId + "'"};
    }
  } catch (...) {
    failure = detail::statusFromCurrentException();
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
    if (service_.store_.cancelWait(*id)) {
      std::lock_guard lock(mutex_);
      pending_.erase(slot);
    }
  } else {
    service_.wakeTimer(deadline);
  }
}

void StoreSession::waitDone(uint64_t slot, bool satisfied) {
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
  grpc::Status status;
  try {
    if (!satisfied) {
      auto failure = detail::waitFailure(service_.store_, service_.options_, wait.scope, wait.keys,
                                         wait.timeoutMs);
      if (failure) status = *failure;
    }
    if (status.ok() && !fillSatisfied(wait, response)) {
      wait.waitId.reset();
      addPending(std::move(wait));  // a key was deleted between the wake-up and the read
      return;
    }
  } catch (...) {
    status = detail::statusFromCurrentException();
  }
  respond(std::move(response), status);
}

void StoreSession::respond(v1::StoreResponse response, const grpc::Status& status) {
  if (!status.ok()) {
    response.clear_result();
    detail::setStatus(response, status);
  }
  std::lock_guard lock(mutex_);
  if (ending_) return;
  queuedBytes_ += response.ByteSizeLong();
  queue_.push_back(std::move(response));
  if (!writing_) startWriteLocked();
}

void StoreSession::startWriteLocked() {
  writing_ = true;
  // A deque keeps its elements in place as others are added, so the front stays valid until
  // OnWriteDone pops it.
  StartWrite(&queue_.front());
}

void StoreSession::finishLocked(const grpc::Status& status) {
  ending_ = true;
  if (finished_) return;
  if (!finishAfterWrite_) finishAfterWrite_ = status;  // the first reason wins
  if (writing_) {
    // The write in flight must complete first (its message is ours until OnWriteDone); the rest
    // will never be sent.
    while (queue_.size() > 1) {
      queuedBytes_ -= queue_.back().ByteSizeLong();
      queue_.pop_back();
    }
    return;
  }
  queue_.clear();
  queuedBytes_ = 0;
  finished_ = true;
  Finish(bounded(*finishAfterWrite_));
}

void StoreSession::finishIfIdleLocked() {
  if (readsDone_ && !ending_ && pending_.empty() && queue_.empty() && !writing_) {
    finishLocked(grpc::Status::OK);
  }
}

std::vector<RunScopedStore::WaitId> StoreSession::takeArmedLocked() {
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

bool StoreSession::queueFullLocked() const {
  return queue_.size() >= kMaxQueuedResponses || queuedBytes_ >= kMaxQueuedBytes;
}

}  // namespace ddprun
