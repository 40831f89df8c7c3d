// Backend side of a Work handle (internal). A backend completes a PromiseWork from its own thread,
// or implements WorkState itself (NCCL polls a CUDA event).
#pragma once

#include <condition_variable>
#include <exception>
#include <mutex>

namespace ddp::detail {

class WorkState {
 public:
  virtual ~WorkState() = default;
  virtual void wait() = 0;
  virtual bool isCompleted() = 0;
};

// Completed once, by the thread that ran the operation.
class PromiseWork final : public WorkState {
 public:
  void wait() override;
  bool isCompleted() override;
  // Marks the operation done; `error` is null on success.
  void complete(std::exception_ptr error);

 private:
  std::mutex mutex_;
  std::condition_variable done_;
  bool completed_ = false;
  std::exception_ptr error_;
};

}  // namespace ddp::detail
