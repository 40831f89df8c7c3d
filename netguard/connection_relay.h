// Relays a client's connection to gRPC through a socket pair, reading the client's side as far as
// HTTP/2 frame headers (http2_frames.h), so that a connection is cut the moment it opens streams
// or sends control frames faster than AbuseLimits allow: before gRPC has read them, let alone made
// calls of them. gRPC 1.51 reads whatever a connection sends and creates a call for each new
// stream at once; a client that opens and resets streams in a loop (HTTP/2 rapid reset) grew the
// daemon by gigabytes in seconds. Looking at calls in the handlers comes too late: the handlers
// run seconds behind the reads under such a flood.
//
// The cost: two more descriptors per relayed connection (the client's socket and our end of the
// pair) and one copy of each byte through one thread. The server relays where it is exposed (a
// job token or a non-loopback address: RendezvousServerOptions::guard); buffers are bounded
// (kBufferBytes each way), so a slow reader slows its writer instead of growing memory.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/unique_fd.h"
#include "netguard/abuse_guard.h"
#include "netguard/relay_buffer.h"
#include "tls/server_context.h"

namespace ddprun {

struct ConnectionRelayStats {
  uint64_t relayed = 0;         // connections ever added
  uint64_t open = 0;            // connections relayed now
  uint64_t closedForAbuse = 0;  // cut for breaking the stream or control-frame limits
  uint64_t recognized = 0;      // trusted at once: the job token was in their request headers
  uint64_t gatedClosed = 0;     // gated connections whose first request lacked the token
  uint64_t tlsFailed = 0;       // TLS handshakes that failed or timed out
  uint64_t tlsEstablished = 0;  // TLS handshakes that completed
  uint64_t tlsQueued = 0;       // TLS handshakes that waited for their address's turn (maxHandshakesPerAddress)
  uint64_t evictedIdle = 0;     // untrusted idle connections cut to make room at the front door's cap (evictIdle)
};

// The job token, and the request header that carries it, for the relay to recognize an agent at
// its first stream (token_recognizer.h). An empty value: none to look for.
struct RelayToken {
  std::string metadataKey;
  std::string value;
};

// TLS terminated in the relay (README "Security"): the client's side is ciphertext, gRPC's side
// plaintext, so the frame limits hold for encrypted connections too.
struct RelayTls {
  std::shared_ptr<TlsServerContext> context;  // null: no TLS
  // A connection whose handshake has not finished by then is closed.
  std::chrono::milliseconds handshakeTimeout{std::chrono::seconds(10)};
  // Handshakes of one client address at once; more wait their turn (queued, not refused: a mass
  // start behind one NAT address still forms). Their timeout starts with their turn.
  std::size_t maxHandshakesPerAddress = 256;
  // While others of its address wait, a handshake whose client sent nothing for this long (since
  // it connected) gives its turn up: it is closed (handshake_queue.h).
  std::chrono::milliseconds stallGrace{std::chrono::seconds(1)};
  // Runs on the relay's thread, with no lock of the relay held, when a connection's handshake
  // failed or timed out (it is closed): for the log.
  std::function<void(const std::string& address, const std::string& why)> onFailure;
};

class ConnectionRelay {
 public:
  static constexpr std::size_t kBufferBytes = kRelayBufferBytes;
  // `onAbuse(address, why)` runs on the relay's thread, with no lock of the relay held, after a
  // connection was cut for breaking the limits.
  ConnectionRelay(AbuseLimits limits, RelayToken token,
                  std::function<void(const std::string& address, const std::string& why)> onAbuse,
                  RelayTls tls = {});
  ~ConnectionRelay();  // closes every relayed connection
  ConnectionRelay(const ConnectionRelay&) = delete;
  ConnectionRelay& operator=(const ConnectionRelay&) = delete;

  struct Added {
    UniqueFd grpcSide;  // to give gRPC in the client's place; empty when no socket pair could be made
    uint64_t id = 0;    // names the connection in close()
  };
  // Relays `client` (a connected socket from `address`; the relay owns it from here on). With
  // `trusted` false the connection may open only untrustedCallBurst streams, drawing on the
  // budget all untrusted connections share, until trust(id) or until its request headers carry
  // the job token.
  // `gated`: from an address that broke the limits lately; nothing of it reaches gRPC until its
  // first request headers carry the token, and a request without it closes it (a relay without a
  // token to look for treats it as untrusted).
  Added add(UniqueFd client, const std::string& address, bool trusted, bool gated = false);
  // Cuts connection `id` (from any thread; the relay's thread closes it soon after). Unknown or
  // closed ids are ignored. With `why`: nothing more of the client reaches gRPC, but what gRPC
  // writes (the answer of the call that broke the limits) still reaches the client for 200 ms,
  // then a GOAWAY carrying "ddprun-rdzv closed the connection: it <why>", then the close.
  void close(uint64_t id, std::string why = {});
  // Connection `id` made a call with a valid job token: from now on it may open callBurst streams
  // at once instead of untrustedCallBurst (from any thread; takes effect soon after).
  void trust(uint64_t id);
  // Cuts the untrusted connection (no token shown) that has opened no stream for the longest, if
  // that is `idleFor` at least: for the front door at its connection cap, so that strangers' idle
  // connections cannot hold the cap against a job. Trusted connections are never cut. From any
  // thread; waits for the relay's thread (a scan of its connections). Whether one was cut.
  bool evictIdle(std::chrono::milliseconds idleFor);
  ConnectionRelayStats stats() const;

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun
