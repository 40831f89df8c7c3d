#include "store/grpc/store_session.h"

#include <chrono>
#include <utility>

#include "rpc/grpc_util.h"
#include "store/core/store_limits.h"
#include "store/grpc/store_service.h"

namespace ddprun {

namespace {

// Reading pauses while this many answers are queued for a client that does not read them (or
// kMaxQueuedAnswerBytes, store_limits.h).
constexpr std::size_t kMaxQueuedResponses = 256;

}  // namespace

StoreSession::StoreSession(StoreService& service) : service_(service) {}

StoreSession* StoreSession::start(std::shared_ptr<StoreSession> session, const grpc::Status& admission) {
  StoreSession* raw = session.get();
  std::weak_ptr<StoreSession> weak = session;
  raw->handler_ = std::make_shared<StoreRequestHandler>(raw->service_.core(), [weak](v1::StoreResponse&& response) {
    if (auto self = weak.lock()) self->queueResponse(std::move(response));
  });
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
  {
    std::lock_guard lock(mutex_);
    if (ending_) return;
    finishLocked(status);
  }
  handler_->end();
}

void StoreSession::OnReadDone(bool ok) {
  if (!ok) {
    // Half-closed (or gone: then OnCancel ends the session). Answer what is pending, then finish.
    std::lock_guard lock(mutex_);
    readsDone_ = true;
    finishIfIdleLocked();
    return;
  }
  {
    std::lock_guard lock(mutex_);
    ++requests_;
  }
  handler_->handle(request_);
  std::lock_guard lock(mutex_);
  if (ending_) return;
  if (queueFullLocked()) {
    readPaused_ = true;  // OnWriteDone reads on once the client has taken some answers
  } else {
    StartRead(&request_);
  }
}

void StoreSession::OnWriteDone(bool ok) {
  bool gone = false;
  {
    std::lock_guard lock(mutex_);
    queuedBytes_ -= queue_.front().ByteSizeLong();
    queue_.pop_front();
    writing_ = false;
    if (!ok) {
      // The stream broke under the write: the client is gone.
      gone = true;
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
  if (gone) handler_->end();
}

void StoreSession::OnCancel() { end({grpc::StatusCode::CANCELLED, "store session cancelled"}); }

void StoreSession::OnDone() {
  {
    std::lock_guard lock(mutex_);
    ending_ = true;
  }
  handler_->end();  // none is left in any way of ending, but never leak a wait
  service_.removeSession(this);
  auto last = std::move(self_);  // may delete this on return, unless a store callback holds it
}

void StoreSession::queueResponse(v1::StoreResponse response) {
  std::lock_guard lock(mutex_);
  if (ending_) return;
  ++answers_;
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
  if (readsDone_ && !ending_ && answers_ == requests_ && queue_.empty() && !writing_) {
    finishLocked(grpc::Status::OK);
  }
}

bool StoreSession::queueFullLocked() const {
  return queue_.size() >= kMaxQueuedResponses || queuedBytes_ >= kMaxQueuedAnswerBytes;
}

}  // namespace ddprun
