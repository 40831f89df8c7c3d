// One Session stream of the Store service: a client's long-lived stream that carries all its
// operations, so that each costs one message each way instead of a whole unary call.
//
// Requests are read one at a time. Quick operations run inline in OnReadDone; a Get or Wait that
// must wait registers the RunScopedStore's asynchronous wait (never blocking a gRPC thread) and
// answers from its callback, from the service's timer at its timeout, or not at all when the
// session ends first. Responses carry the request's id and may go out of order; one write is in
// flight at a time, the rest queue. Reading pauses while the queue is long, so that a client that
// sends without reading stalls on flow control instead of growing the queue.
//
// Lifetime: owned by shared_ptr (the reactor itself, until OnDone, and every pending wait's
// callback), because a store callback may run on another thread while the stream ends.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "ddprun/v1/store.pb.h"
#include "store/run_scoped_store.h"

namespace ddprun {

class StoreService;

class StoreSession final : public grpc::ServerBidiReactor<v1::StoreRequest, v1::StoreResponse>,
                           public std::enable_shared_from_this<StoreSession> {
 public:
  explicit StoreSession(StoreService& service);

  // Starts the session, or finishes it at once with `admission` when that is not OK (a wrong
  // token, a service shutting down). Returns the reactor for gRPC.
  static StoreSession* start(std::shared_ptr<StoreSession> session, const grpc::Status& admission);

  // Ends the session with `status`: pending waits are forgotten, queued responses dropped. From
  // the service's shutdown(); idempotent.
  void end(const grpc::Status& status);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

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

  void handle(v1::StoreRequest& request);
  // A Get or Wait: answered at once when its keys exist or it may not wait, else registered.
  void handleBlocking(v1::StoreRequest& request);
  // Fills a satisfied wait's result; false when a key vanished again and it must wait on.
  bool fillSatisfied(const PendingWait& wait, v1::StoreResponse& response) const;
  void addPending(PendingWait wait);
  void arm(uint64_t slot, const PendingWait& wait);
  void waitDone(uint64_t slot, bool satisfied);
  void respond(v1::StoreResponse response, const grpc::Status& status);

  // The rest run under mutex_.
  void startWriteLocked();
  void finishLocked(const grpc::Status& status);
  void finishIfIdleLocked();
  // Takes every armed wait out of pending_, for the caller to cancel after unlocking.
  std::vector<RunScopedStore::WaitId> takeArmedLocked();
  bool queueFullLocked() const;

  StoreService& service_;
  std::shared_ptr<StoreSession> self_;  // released in OnDone
  v1::StoreRequest request_;            // the read in flight fills it; handled before the next read

  std::mutex mutex_;
  std::deque<v1::StoreResponse> queue_;  // front: the write in flight, when writing_
  std::size_t queuedBytes_ = 0;
  bool writing_ = false;
  bool readPaused_ = false;  // the queue was full after the last request; OnWriteDone reads on
  bool readsDone_ = false;   // the client half-closed: finish once every answer is out
  bool ending_ = false;      // no request is handled any more
  bool finished_ = false;    // Finish was called
  std::optional<grpc::Status> finishAfterWrite_;
  std::unordered_map<uint64_t, PendingWait> pending_;  // by slot, a number of ours
  uint64_t nextSlot_ = 1;
};

}  // namespace ddprun
