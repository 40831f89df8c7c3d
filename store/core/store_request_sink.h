// Where an adapter hands the requests of one connection: StoreRequestHandler runs them on a
// StoreCore in this process; store/forward/ sends them on to a store elsewhere. The adapter does
// not know which.
//
// Contract (both): every request given to handle() gets exactly one answer through the Respond
// sink given at construction, until end(); answers go out with no lock of the sink held, from any
// thread, possibly before handle() returns. After end(), pending requests are forgotten and no
// answer comes. Owned by shared_ptr (an answer may run on another thread while the connection
// ends).
//
// A sink over a store in this process may also answer on the caller's thread (answersNow(),
// answerNow()): the same request run the same way, its answer returned instead of sent through
// Respond, so that an adapter saves the hand-over per request. An adapter that uses it still hands
// every request answerNow() declines (a wait that must wait) to handle().
#pragma once

#include <functional>
#include <memory>

#include "ddprun/v1/store.pb.h"

namespace ddprun {

class StoreRequestSink {
 public:
  using Respond = std::function<void(v1::StoreResponse&& response)>;
  // Makes the sink of one new connection, answering through `respond`.
  using Factory = std::function<std::shared_ptr<StoreRequestSink>(Respond respond)>;

  virtual ~StoreRequestSink() = default;
  // Runs `request` (its values may be moved out); its answer goes to the sink, now or later.
  virtual void handle(v1::StoreRequest& request) = 0;
  // Forgets every pending request and drops every later answer. Idempotent.
  virtual void end() = 0;

  // Whether answerNow() may answer at all (fixed for the sink's life). False: every request goes
  // to handle() (a sink that answers later, store/forward/).
  virtual bool answersNow() const { return false; }
  // Runs `request` now, on the caller's thread, when it needs no waiting: true, and `response`
  // holds its answer (what Respond would have been given; Respond is not called). False: nothing
  // was done, `request` is as it was; hand it to handle(). Not after end().
  virtual bool answerNow(v1::StoreRequest& /*request*/, v1::StoreResponse& /*response*/) { return false; }
};

}  // namespace ddprun
