#include "worker_sdk/work.h"

#include "worker_sdk/work_state.h"

#include <mutex>
#include <set>

namespace ddp {

Work::Work(std::shared_ptr<detail::WorkState> state) : state_(std::move(state)) {}

namespace {
// The threads in Work::wait(), once per wait (a thread may wait in a nested call).
std::mutex waitingMutex;
std::multiset<std::thread::id> waiting;
}  // namespace

void Work::wait() const {
  if (!state_) return;
  struct Waiting {
    Waiting() {
      std::lock_guard<std::mutex> lock(waitingMutex);
      waiting.insert(std::this_thread::get_id());
    }
    ~Waiting() {
      std::lock_guard<std::mutex> lock(waitingMutex);
      waiting.erase(waiting.find(std::this_thread::get_id()));
    }
  } inWait;
  state_->wait();
}

bool Work::isCompleted() const { return !state_ || state_->isCompleted(); }

namespace detail {

bool waitingOnWork(std::thread::id thread) {
  std::lock_guard<std::mutex> lock(waitingMutex);
  return waiting.count(thread) != 0;
}

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
