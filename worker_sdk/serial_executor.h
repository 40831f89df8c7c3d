// One worker thread that runs tasks in submission order (internal): how the gloo backend makes its
// synchronous algorithms asynchronous without reordering collectives.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace ddp::detail {

class SerialExecutor {
 public:
  SerialExecutor();
  // Runs the tasks still queued, then joins the thread.
  ~SerialExecutor();
  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;

  // Queues a task; it must not throw.
  void submit(std::function<void()> task);

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts after the members above exist
};

}  // namespace ddp::detail
