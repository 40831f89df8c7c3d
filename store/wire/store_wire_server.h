// Serves the store's own framing (store_wire.h) on connections the server's front door hands over
// (ConnectionListenerOptions::sideProtocol): one epoll thread reads, runs each request through a
// StoreRequestHandler over the StoreCore (the code the gRPC adapter runs too) and writes the
// answers, batched per wake-up. Answers of waits that complete later come from other threads and
// are written by this one. When the client half-closes, what it sent is answered (pending waits
// too, each by its own timeout at most) and then the connection closes, as a Session stream does.
//
// Bounds (docs/store.md, "Memory"): a connection must send its hello within helloTimeout, and at
// most kMaxHelloBytes before it has shown the token; a frame over kMaxFrameBytes, or bytes that are
// no StoreRequest, close it (and are reported to onAbuse, for the front door's penalties). Reading
// pauses while kMaxQueuedAnswerBytes of answers wait for a client that does not read. Waits per
// connection are bounded by StoreCoreOptions::maxPendingPerConnection, as on a Session stream.
// Across connections, what they hold (partial frames, answers not yet written) is bounded by
// maxHeldBytes: a frame's whole size is reserved when its header arrives, and one that does not fit
// waits, unread, for its turn; at the bound no request runs. A reserved frame always fits, so the
// server never waits on itself; the clients that hold memory without moving it are closed after
// stallTimeout.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/unique_fd.h"

namespace ddprun {

class StoreCore;

struct StoreWireServerOptions {
  // A connection that has not sent its whole hello by then is closed.
  std::chrono::milliseconds helloTimeout{std::chrono::seconds(10)};
  // Bytes held across connections at most (partial frames and unsent answers), before the
  // answers of waits that complete meanwhile: 128 MiB holds one largest value and change.
  std::size_t maxHeldBytes = 128u << 20;
  // A connection whose partial frame gets no byte, or whose answers see no byte written, for this
  // long is closed: it holds memory nobody else may use.
  std::chrono::milliseconds stallTimeout{std::chrono::seconds(10)};
  // A frame must arrive whole within this long of its turn (its reservation): one that trickles
  // in a byte at a time would hold its reservation for good.
  std::chrono::milliseconds frameTimeout{std::chrono::seconds(60)};
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
  uint64_t closedStalled = 0;  // closed: a partial frame or its answers did not move for stallTimeout, or a frame took over frameTimeout
  uint64_t heldForMemory = 0;  // times a connection waited because the connections held maxHeldBytes
  uint64_t heldBytes = 0;      // bytes held now across connections (reserved frames, unsent answers)
  uint64_t wakeups = 0;        // times the server's thread woke: a paused or idle server must not spin
};

class StoreWireServer {
 public:
  // Starts the thread. `core` must outlive the server.
  StoreWireServer(StoreCore& core, StoreWireServerOptions options);
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
