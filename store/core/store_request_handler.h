// The operations of one client connection to the store, whatever carries them: a gRPC Session
// stream or one unary call (store/grpc/), a connection in the store's own framing (store/wire/).
// This is the one place where a request runs and a wait lives; the adapters only carry bytes.
//
// Quick operations answer inside handle(); a Get or Wait whose keys are missing registers the
// RunScopedStore's asynchronous wait (never blocking the caller's thread) and answers from its
// callback, from the core's timer at its timeout, or not at all once end() was called. A wait
// with timeout 0 is answered at once. Every request handed to handle() gets exactly one answer
// until end(): an adapter that counts both knows when nothing is owed. Half-close is the adapter's
// to see; the rule for all of them: answer every request already read, then close. Every
// answer goes to the `respond` sink given at construction, with no lock of the handler held; it
// may run on any thread (the caller of handle(), a store callback, the timer).
//
// Lifetime: owned by shared_ptr, because a pending wait's callback may run on another thread
// while the connection ends; construct with std::make_shared.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "ddprun/v1/store.pb.h"
#include "store/core/run_scoped_store.h"
#include "store/core/store_core.h"
#include "store/core/store_request_sink.h"
#include "store/core/store_status.h"

namespace ddprun {

class StoreRequestHandler final : public StoreRequestSink,
                                  public std::enable_shared_from_this<StoreRequestHandler> {
 public:

  StoreRequestHandler(StoreCore& core, Respond respond);

  // Runs `request` (its values are moved out); its answer goes to the sink, now or later.
  void handle(v1::StoreRequest& request) override;
  // Forgets every pending wait (cancelled in the store) and drops every later answer. Idempotent.
  void end() override;
  // Every request but a Get or Wait whose keys are missing (and that may wait) is answered here.
  bool answersNow() const override { return true; }
  bool answerNow(v1::StoreRequest& request, v1::StoreResponse& response) override;

 private:
  // A Get or Wait waiting for its keys.
  struct PendingWait {
    uint64_t requestId = 0;
    bool isGet = false;
    StoreScope scope;
    std::vector<std::string> keys;
    uint32_t timeoutMs = 0;
    RunScopedStore::TimePoint deadline;
    std::optional<RunScopedStore::WaitId> waitId;  // unset until waitAsync returned
  };

  // A Get or Wait: answered at once when its keys exist or it may not wait, else registered.
  void handleBlocking(v1::StoreRequest& request);
  // A Get or Wait's answer when it has one now (its keys exist, it may not wait, or it fails):
  // true, `response` and `status` set. False: it must wait, as `wait` says.
  bool answerBlockingNow(const v1::StoreRequest& request, PendingWait& wait, v1::StoreResponse& response,
                         StoreStatus& status) const;
  // A quick request's answer.
  StoreStatus runQuick(v1::StoreRequest& request, v1::StoreResponse& response);
  // Fills a satisfied wait's result; false when a key vanished again and it must wait on.
  bool fillSatisfied(const PendingWait& wait, v1::StoreResponse& response) const;
  void addPending(PendingWait wait);
  void waitDone(uint64_t slot, bool satisfied);
  void respond(v1::StoreResponse response, const StoreStatus& status);
  // Takes every armed wait out of pending_, for the caller to cancel after unlocking.
  std::vector<RunScopedStore::WaitId> takeArmedLocked();

  StoreCore& core_;
  const Respond respond_;
  mutable std::mutex mutex_;
  bool ending_ = false;
  std::unordered_map<uint64_t, PendingWait> pending_;  // by slot, a number of ours
  uint64_t nextSlot_ = 1;
};

}  // namespace ddprun
