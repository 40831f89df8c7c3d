// One Session stream of the Store service: a client's long-lived stream that carries all its
// operations, so that each costs one message each way instead of a whole unary call.
//
// Requests are read one at a time and run by a StoreRequestHandler (quick ones inline in
// OnReadDone; a Get or Wait that must wait answers later, from the store's callback or the
// core's timer, or not at all when the session ends first). After the client half-closes, the
// session answers what it read and finishes once nothing waits (the rule of every adapter). Responses carry the request's id and may go out of order; one write is in
// flight at a time, the rest queue. Reading pauses while the queue is long, so that a client that
// sends without reading stalls on flow control instead of growing the queue.
//
// Lifetime: owned by shared_ptr (the reactor itself, until OnDone); the handler's late answers
// find it through a weak_ptr.
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
#include "store/core/store_request_handler.h"

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
  // An answer from the handler, on any thread: queued, and written when no write is in flight.
  void queueResponse(v1::StoreResponse response);

  // The rest run under mutex_.
  void startWriteLocked();
  void finishLocked(const grpc::Status& status);
  void finishIfIdleLocked();
  bool queueFullLocked() const;

  StoreService& service_;
  std::shared_ptr<StoreRequestHandler> handler_;  // set in start()
  std::shared_ptr<StoreSession> self_;  // released in OnDone
  v1::StoreRequest request_;            // the read in flight fills it; handled before the next read

  std::mutex mutex_;
  std::deque<v1::StoreResponse> queue_;  // front: the write in flight, when writing_
  std::size_t queuedBytes_ = 0;
  bool writing_ = false;
  bool readPaused_ = false;  // the queue was full after the last request; OnWriteDone reads on
  bool readsDone_ = false;   // the client half-closed: finish once every answer is out
  // Requests handed to the handler, and answers queued: each request gets exactly one answer, so
  // equal counts mean none is owed (pending in the store or on its way from another thread).
  uint64_t requests_ = 0;
  uint64_t answers_ = 0;
  bool ending_ = false;      // no request is handled any more
  bool finished_ = false;    // Finish was called
  std::optional<grpc::Status> finishAfterWrite_;
};

}  // namespace ddprun
