// The metrics port of the rendezvous daemon and the agent (DESIGN.md 8): Prometheus scrapes
// (GET /metrics) and the health probes (GET /healthz, GET /readyz) on one small HTTP server with
// bounded threads, queue, request size and time.
//
// It runs civetweb's CivetServer itself rather than prometheus::Exposer: Exposer serves only
// registered collectables and cannot answer /readyz with 503 while the process is not ready.
#pragma once

#include <prometheus/collectable.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ddprun {

class MetricsEndpoint {
 public:
  struct Options {
    // Loopback unless the user names another address. IPv4 addresses and host names only with
    // Debian 12's civetweb 1.15, which is built without IPv6: "::1" is refused with ConfigError.
    std::string bindAddress = "127.0.0.1";
    int port = 0;  // 0: an ephemeral port, see port()
    // Requests served at once. A connection holds its worker until its request came in or
    // requestTimeout passed, so idle connections delay others by up to requestTimeout each.
    int threads = 2;
    // Accepted connections waiting for a worker, and the kernel's listen backlog: beyond both,
    // new connections wait in the client's SYN retries instead of costing memory here.
    int maxQueuedConnections = 32;
    // To receive a whole request, and to send the answer.
    std::chrono::milliseconds requestTimeout{5000};
  };

  // Whether the process serves its purpose now (/readyz: 200 or 503). Called on a server thread,
  // without any lock of the endpoint held. Empty: always ready; throwing: not ready.
  using Readiness = std::function<bool()>;

  // Starts serving at once. Collectables are held weakly, as prometheus::Exposer holds them: the
  // caller keeps each alive (a temporary make_shared<>() drops out at once), and one whose owner
  // is gone drops out of the scrape; pass a prometheus::Registry for metrics that come and go.
  // Throws ConfigError with one line naming the address when the options are invalid or the
  // address cannot be bound.
  MetricsEndpoint(Options options, std::vector<std::weak_ptr<prometheus::Collectable>> collectables,
                  Readiness readiness = {});
  // Stops serving and joins the server's threads: milliseconds, but up to 2 s while a connection
  // is still sending its request (civetweb looks at its stop flag between 2 s reads).
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  // The bound port (the ephemeral one when Options::port was 0).
  int port() const { return port_; }
  // "host:port" ("[v6]:port"), with the bound port.
  std::string address() const;

 private:
  class Server;  // CivetServer and the request callbacks, in the .cc

  // The exposition text of every live collectable (GET /metrics); may throw what one throws.
  std::string scrape() const;
  bool ready() const;
  void noteCivetMessage(const char* message) const;

  Options options_;
  std::vector<std::weak_ptr<prometheus::Collectable>> collectables_;
  Readiness readiness_;
  // The first message civetweb logged: why the start failed, when it did.
  mutable std::mutex civetMessageMutex_;
  mutable std::string firstCivetMessage_;
  int port_ = 0;
  std::unique_ptr<Server> server_;  // last: its threads stop before the members they use go
};

}  // namespace ddprun
