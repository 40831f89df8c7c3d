// Serves the store's own framing (store_wire.h) on connections the server's front door hands over
// (ConnectionListenerOptions::storeWire): one epoll thread reads, runs each request through a
// StoreRequestHandler (the code the gRPC Session runs) and writes the answers, batched per
// wake-up. Answers of waits that complete later come from other threads and are written by this
// one.
//
// Bounds: a connection must send its hello within helloTimeout, and at most kMaxHelloBytes
// before it has shown the token; a frame over kMaxFrameBytes, or bytes that are no StoreRequest,
// close it (and are reported to onAbuse, for the front door's penalties). Reading pauses while
// 64 MiB of answers wait for a client that does not read. Waits per connection are bounded by
// StoreServiceOptions::maxPendingPerSession, as on a Session stream.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/unique_fd.h"

namespace ddprun {

class StoreService;

struct StoreWireServerOptions {
  // A connection that has not sent its whole hello by then is closed.
  std::chrono::milliseconds helloTimeout{std::chrono::seconds(10)};
  // Called (on the server's thread, no lock held) when a connection is closed for sending what no
  // client of ours sends: for the front door to refuse its address for a while, and to log it
  // (unset: the server logs it).
  std::function<void(const std::string& address, const std::string& why)> onAbuse;
};

struct StoreWireServerStats {
  uint64_t accepted = 0;     // connections handed over
  uint64_t open = 0;         // open now
  uint64_t refusedToken = 0;  // closed: their hello lacked the job token
  uint64_t closedBroken = 0;  // closed: no hello in time, too large a frame, or unreadable bytes
};

class StoreWireServer {
 public:
  // Starts the thread. `service` must outlive the server.
  StoreWireServer(StoreService& service, StoreWireServerOptions options);
  ~StoreWireServer();  // stop()
  StoreWireServer(const StoreWireServer&) = delete;
  StoreWireServer& operator=(const StoreWireServer&) = delete;

  // Takes over connection `fd` (from `address`), whose first bytes are storewire::kMagic, not yet
  // read. From any thread.
  void adopt(UniqueFd fd, std::string address);
  // Closes every connection (their pending waits are forgotten) and stops the thread. Idempotent.
  void stop();
  StoreWireServerStats stats() const;

  class Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace ddprun
