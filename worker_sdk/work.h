// A handle on an asynchronous collective, as c10d's Work: wait() blocks until the operation is
// done and rethrows its error. Copies share one operation; an empty handle is already done.
#pragma once

#include <memory>

namespace ddp {

namespace detail {
class WorkState;
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
