// A handle on an asynchronous collective, as c10d's Work: wait() blocks until the operation is
// done and rethrows its error. Copies share one operation; an empty handle is already done.
#pragma once

#include <memory>
#include <thread>

namespace ddp {

namespace detail {
class WorkState;
// Whether thread `thread` is in Work::wait() now: in-process recovery beats for a rank only while
// its training thread waits on its peers (worker_sdk/recovery.cc), so that a rank hung in its own
// code falls silent and is the one --hang_timeout finds.
bool waitingOnWork(std::thread::id thread);
}

class Work {
 public:
  Work() = default;
  explicit Work(std::shared_ptr<detail::WorkState> state);

  // Blocks until the operation finished; throws its error (ddprun::TimeoutError when it ran past
  // the communicator's timeout, ddprun::ConnectionError when a peer failed, ...). Once it
  // returned, the output buffers hold the result. May be called again; it throws again.
  void wait() const;
  // Whether the operation has finished (successfully or not); never blocks.
  bool isCompleted() const;

 private:
  std::shared_ptr<detail::WorkState> state_;
};

}  // namespace ddp
