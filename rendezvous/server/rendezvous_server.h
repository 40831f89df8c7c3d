// The rendezvous server: the Rendezvous and Store services on one gRPC port. Embedded in the agent
// that hosts a job's endpoint, or run alone as ddprun-rdzv for many jobs.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "common/net.h"  // parseEndpoint, joinHostPort
#include "netguard/abuse_guard.h"  // AbuseLimits
#include "rendezvous/server/daemon_metrics.h"  // MetricsPortOptions
#include "store/core/run_scoped_store.h"  // RunScopedStoreOptions
#include "tls/server_context.h"  // TlsServerContext

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
  // Calls one connection may start (a budget, and at most one without a valid token), and how
  // long an address that broke them is refused: against floods of calls such as HTTP/2 rapid
  // reset, which gRPC 1.51 itself does not stop (abuse_guard.h).
  AbuseLimits abuse;
  // Whether connections pass through the frame-counting relay (connection_relay.h), which cuts a
  // flood of streams or control frames before gRPC reads it. On unless kOff: every configuration
  // but an explicit off bounds memory under HTTP/2 abuse.
  enum class Guard { kOn, kOff };
  Guard guard = Guard::kOn;
  // Streams open at once on one connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS). An agent
  // holds one, a store client one. 0: gRPC's default (unlimited).
  int maxStreamsPerConnection = 100;
  // Memory gRPC may use for connections and calls (grpc::ResourceQuota): past it, gRPC stops
  // reading from connections and cancels streams. 0: no quota.
  std::size_t memoryQuotaBytes = std::size_t{1} << 30;
  // How often the server hands freed memory back to the system (malloc_trim): after a burst
  // (a large job, an attack) the heap would otherwise keep its peak size. 0: never.
  std::chrono::milliseconds trimInterval{std::chrono::seconds(5)};
  // TLS for every connection (README "Security"), terminated in the guard's relay; null: plaintext.
  // Shared so that its owner can reload the certificate (SIGHUP) while the server runs.
  std::shared_ptr<TlsServerContext> tls;
  // What the Status call says this server is: "ddprun-rdzv 0.1.0", "agent-hosted".
  std::string serverName = "ddprun";
  // --metrics_port: Prometheus metrics and the /healthz, /readyz probes (daemon_metrics.h).
  MetricsPortOptions metrics;
};

// "on" or "off" as a Guard ("auto", an older spelling of on, too); ConfigError naming `what` otherwise.
RendezvousServerOptions::Guard parseGuard(const std::string& value, const std::string& what);
// The guard DDPRUN_RDZV_GUARD asks for (on when unset), for every server this process hosts:
// ddprun-rdzv (its --connection_guard's default) and an agent that hosts its job's rendezvous.
RendezvousServerOptions::Guard guardFromEnvironment();

// Raises this process's soft limit on open files to its hard limit, for a process that hosts a
// server: each agent and each store client holds a connection, i.e. a descriptor, and the usual
// soft limit (1024) would stop a server near a thousand. Warns when even the hard limit is small.
// Children started afterwards should get the limit back (the agent's supervisor does).
// `reserveFds` and `guard` as the server's options will have them: the warning says how many
// connections the cap then allows.
void raiseOpenFileLimitForServing(std::size_t reserveFds, bool guard);

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
  // host:port of the metrics port; empty without one.
  std::string metricsAddress() const;
  // RendezvousService::timerWakeups().
  uint64_t timerWakeups() const;
  // The front door's counters (what the metrics port shows as ddprun_guard_*).
  ConnectionListenerStats connectionStats() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun
