// The rendezvous server: the Rendezvous and Store services on one gRPC port. Embedded in the agent
// that hosts a job's endpoint, or run alone as ddprun-rdzv for many jobs.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "common/net.h"  // parseEndpoint, joinHostPort
#include "store/run_scoped_store.h"  // RunScopedStoreOptions

namespace ddprun {

struct RendezvousServerOptions {
  std::string bindAddress = "127.0.0.1";  // where to listen; "0.0.0.0" or "::" only when asked
  int port = 29400;                       // 0: any free port
  std::string token;                      // job token; empty = unauthenticated
  // A connection that has not sent the HTTP/2 preface by then is closed, so that silent
  // connections cannot pile up holding file descriptors (0: the listener's default, 10 s).
  std::chrono::milliseconds handshakeTimeout{std::chrono::seconds(10)};
  // Connections open at once; more are closed as they come. 0: as many as the open-file limit
  // allows, less reserveFds. The server's own accept loop recovers from EMFILE/ENFILE.
  std::size_t maxConnections = 0;
  std::size_t reserveFds = 128;
  // For the two below, 0 leaves gRPC's default.
  // A connection without a call for this long is told to go away (gRPC's default: never). Agents
  // and store clients hold a stream (a call) open while they work, and reconnect on their next
  // call otherwise.
  std::chrono::milliseconds idleTimeout{std::chrono::minutes(5)};
  // The server pings a connection that has carried nothing for this long and closes it when no
  // answer comes within 20 s (at most this long again): a peer host that died without a word
  // would otherwise hold its streams, their waits and a descriptor until the daemon restarts.
  // (gRPC's default: every 2 hours.)
  std::chrono::milliseconds keepalive{std::chrono::seconds(60)};
  // What the store may hold, per job and in all (bytes, keys): a write past a limit fails with
  // RESOURCE_EXHAUSTED naming it.
  RunScopedStoreOptions storeLimits;
  // A job that no agent is connected to is forgotten after this long, its store keys with it, so
  // that an abandoned job neither holds memory nor squats its run id until its join timeout.
  std::chrono::milliseconds jobIdleTimeout{std::chrono::minutes(2)};
  // Refuse a node whose reported address (--local_addr) is not the one it connected from (else a
  // warning): see RendezvousServiceOptions::requireHostMatch.
  bool requireHostMatch = false;
};

// Raises this process's soft limit on open files to its hard limit, for a process that hosts a
// server: each agent and each store client holds a connection, i.e. a descriptor, and the usual
// soft limit (1024) would stop a server near a thousand. Warns when even the hard limit is small.
// Children started afterwards should get the limit back (the agent's supervisor does).
void raiseOpenFileLimitForServing();

class RendezvousServer {
 public:
  // Listens at once. Throws ConnectionError naming the address when it cannot (in use, not local).
  explicit RendezvousServer(RendezvousServerOptions options);
  ~RendezvousServer();

  int port() const;
  // host:port, with brackets for IPv6.
  std::string address() const;
  // Gives agents up to `grace` to read the end of their jobs, then stops.
  void shutdown(std::chrono::milliseconds grace = std::chrono::seconds(2));

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun
