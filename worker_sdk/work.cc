#include "worker_sdk/work.h"

#include "worker_sdk/work_state.h"

namespace ddp {

Work::Work(std::shared_ptr<detail::WorkState> state) : state_(std::move(state)) {}

void Work::wait() const {
  if (state_) state_->wait();
}

bool Work::isCompleted() const { return !state_ || state_->isCompleted(); }

namespace detail {

void PromiseWork::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [this] { return completed_; });
  if (error_) std::rethrow_exception(error_);
}

bool PromiseWork::isCompleted() {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_;
}

void PromiseWork::complete(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    completed_ = true;
    error_ = std::move(error);
  }
  done_.notify_all();
}

}  // namespace detail

}  // namespace ddp
