// Where an adapter hands the requests of one connection: StoreRequestHandler runs them on a
// StoreCore in this process; store/forward/ sends them on to a store elsewhere. The adapter does
// not know which.
//
// Contract (both): every request given to handle() gets exactly one answer through the Respond
// sink given at construction, until end(); answers go out with no lock of the sink held, from any
// thread, possibly before handle() returns. After end(), pending requests are forgotten and no
// answer comes. Owned by shared_ptr (an answer may run on another thread while the connection
// ends).
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
};

}  // namespace ddprun
