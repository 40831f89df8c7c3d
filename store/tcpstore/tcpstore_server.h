// Serves torch's TCPStore protocol (tcpstore_codec.h) over the store core: what a torch rank's
// TCPStore client (is_master=False) talks to, both torch 2.x's and 1.13's. One epoll thread reads
// the connections it is handed, turns each command into a v1::StoreRequest for the connection's
// sink (a StoreRequestHandler over a core, the code the gRPC and framed adapters run too, or a
// forwarder to the job's store elsewhere, store/forward/) and writes the answers in TCPStore's
// bytes.
//
// Scope and admission: the protocol carries no run, round or token. Each connection is bound
// once, when adopted, by the owner's `bind` function, to the scope every request of it uses, or
// refused (closed). A connection bound to a round that is no longer current fails at its next
// request. The protocol has no error reply either: where the handler answers with an error (a
// stale round, a full store, a bad key), the connection is closed, and the client sees its
// connection reset, as when torch's own server fails.
//
// Served: every command of both versions but the queues (QUEUE_PUSH/POP/LEN), BARRIER and 1.13's
// WATCH_KEY, which close the connection (docs/store.md, "TCPStore"). Waits have no timeout on the
// wire: the client times out and sends CANCEL_WAIT, which ends every wait of the connection and
// is answered WAIT_CANCELED (after any STOP_WAITING already owed); the server bounds each by
// waitDeadline. A client that ends its side is closed at once, its waits forgotten, as torch does.
//
// Bounds: at most maxConnections at once (more are closed when handed over); a connection that
// sent no byte is counted, never timed (1.13's callback connection stays silent for good). A
// command over kMaxStoreMessageBytes, a key, value or key count over the store's limits, a byte
// that names no command: closed. A partial command holds at most kUnreservedBytes until it
// declares more; then its whole size is reserved against maxHeldBytes (together with unsent
// answers), and one that does not fit waits, unread, for its turn (one reservation always fits).
// A partial command that gets no byte for stallTimeout, or is not whole within frameTimeout of its
// first byte, closes; so does a client that reads none of its answers for stallTimeout. Reading
// pauses while kMaxQueuedAnswerBytes of answers wait, and while 64 requests of the connection are
// unanswered (a sink that answers later, store/forward/, then holds no unbounded queue).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "common/unique_fd.h"
#include "store/core/run_scoped_store.h"
#include "store/core/store_request_sink.h"

namespace ddprun {

class StoreCore;

// Who is on the other end of a connection, for the binding function.
struct TcpStoreConnectionInfo {
  std::string address;      // "127.0.0.1:5555", "[::1]:5555", "unix:<path>"
  bool loopback = false;    // a loopback IP address
  bool unixSocket = false;
  // The peer process of a unix socket (SO_PEERCRED); unset for TCP. Process-based admission over
  // TCP loopback is the owner's to add in `bind`.
  std::optional<pid_t> pid;
  std::optional<uid_t> uid;
  // The connection's socket, for a binding that asks the kernel more (agent/socket_peer.h); valid
  // during the `bind` call only.
  int fd = -1;
};

struct TcpStoreServerOptions {
  // Binds a connection to the scope all its requests use; nullopt refuses (closes) it. Called on
  // the thread that calls adopt(), no lock of the server held. Required.
  std::function<std::optional<StoreScope>(const TcpStoreConnectionInfo&)> bind;
  // Makes the sink each connection's requests go to (called on the server's thread, under no lock
  // of the server): a StoreRequestHandler over a StoreCore here, or a forwarder to the job's store
  // elsewhere (store/forward/). Required unless the server is made over a StoreCore.
  StoreRequestSink::Factory makeSink;
  std::size_t maxConnections = 4096;
  // Reserved partial commands and unsent answers, across connections.
  std::size_t maxHeldBytes = 128u << 20;
  std::chrono::milliseconds stallTimeout{std::chrono::seconds(10)};
  std::chrono::milliseconds frameTimeout{std::chrono::seconds(60)};
  // How long a wait may pend on the server (the client's own timeout normally ends it sooner). At
  // most 2^32-1 ms.
  std::chrono::milliseconds waitDeadline{std::chrono::hours(24)};
  // Called (server's thread, no lock held) when a connection is closed for bytes no TCPStore
  // client sends; unset: logged (rate-limited).
  std::function<void(const std::string& address, const std::string& why)> onAbuse;
};

struct TcpStoreServerStats {
  uint64_t accepted = 0;       // connections adopted and bound
  uint64_t open = 0;           // open now
  uint64_t refused = 0;        // closed at once: bind refused them, or maxConnections were open
  uint64_t closedBroken = 0;   // closed: bytes no client sends, or a command not served
  uint64_t closedFailed = 0;   // closed: the store answered an error (no error reply exists)
  uint64_t closedStalled = 0;  // closed: a partial command or unread answers did not move
  uint64_t heldForMemory = 0;  // times a connection waited for maxHeldBytes
  uint64_t heldBytes = 0;      // now
  uint64_t legacy = 0;         // connections that spoke torch 1.13's numbering
};

class TcpStoreServer {
 public:
  // What a partial command may hold before it must reserve its declared size.
  static constexpr std::size_t kUnreservedBytes = 256 * 1024;

  // Starts the thread; every connection's requests go to options.makeSink's sinks.
  explicit TcpStoreServer(TcpStoreServerOptions options);
  // Serves `core`, which must outlive the server (options.makeSink is replaced).
  TcpStoreServer(StoreCore& core, TcpStoreServerOptions options);
  ~TcpStoreServer();  // stop()
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  // Takes over a connected socket (not yet read), binds it and serves it. From any thread.
  void adopt(UniqueFd fd);
  // Closes every connection (their waits forgotten) and stops the thread. Idempotent.
  void stop();
  TcpStoreServerStats stats() const;

  // What `fd`'s peer is (getpeername, SO_PEERCRED).
  static TcpStoreConnectionInfo describe(int fd);

  class Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace ddprun
