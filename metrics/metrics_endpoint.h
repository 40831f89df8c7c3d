// The metrics port of the rendezvous daemon and the agent (DESIGN.md 8): Prometheus scrapes
// (GET /metrics) and the health probes (GET /healthz, GET /readyz) on one small HTTP server with
// bounded connections, request size and time.
//
// It runs its own server (Boost.Beast on one Asio thread) rather than prometheus::Exposer: Exposer
// serves only registered collectables and cannot answer /readyz with 503 while the process is not
// ready.
#pragma once

#include <prometheus/collectable.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ddprun {

class MetricsEndpoint {
 public:
  struct Options {
    // Loopback unless the user names another address: an IPv4 or IPv6 address ("::1"), or a host
    // name (its first address that can be bound).
    std::string bindAddress = "127.0.0.1";
    int port = 0;  // 0: an ephemeral port, see port()
    // Connections open at once, idle ones included. Requests are served one at a time on the
    // endpoint's one thread (a scrape takes milliseconds), and a connection that waits for its
    // request costs only its socket, so idle connections never delay another request. At the
    // bound a new connection takes the place of the oldest one that has not yet sent a whole
    // request (a probe sends its request at once, so connections that send nothing cannot keep
    // it out); only when every open connection is being answered is it closed at once.
    int maxConnections = 64;
    // Connections from one client address (the exact IP; IPv4-mapped IPv6 as IPv4), so that one
    // address cannot hold the whole bound. 0: half of maxConnections (at least 1). At this bound
    // a new connection from the address takes the place of that address's own oldest waiting
    // connection: kubelet probes come from the node's address, which whatever else runs on the
    // node (or on loopback, every local process) shares, so the newcomer must win there too.
    int maxConnectionsPerAddress = 0;
    // To receive a whole request, and to send the answer.
    std::chrono::milliseconds requestTimeout{5000};
  };

  // Whether the process serves its purpose now (/readyz: 200 or 503). Called on the server thread,
  // without any lock of the endpoint held. Empty: always ready; throwing: not ready.
  using Readiness = std::function<bool()>;

  // Starts serving at once. Collectables are held weakly, as prometheus::Exposer holds them: the
  // caller keeps each alive (a temporary make_shared<>() drops out at once), and one whose owner
  // is gone drops out of the scrape; pass a prometheus::Registry for metrics that come and go.
  // Throws ConfigError with one line naming the address when the options are invalid or the
  // address cannot be bound.
  MetricsEndpoint(Options options, std::vector<std::weak_ptr<prometheus::Collectable>> collectables,
                  Readiness readiness = {});
  // Stops serving, closes every connection and joins the server's thread: well under a millisecond
  // unless a scrape is being answered, whatever the open connections are doing.
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  // The bound port (the ephemeral one when Options::port was 0).
  int port() const { return port_; }
  // "host:port" ("[v6]:port"), with the bound port.
  std::string address() const;

 private:
  class Server;  // the Asio io_context, its thread, the acceptor and the connections, in the .cc

  // The exposition text of every live collectable (GET /metrics); may throw what one throws.
  std::string scrape() const;
  bool ready() const;

  Options options_;
  std::vector<std::weak_ptr<prometheus::Collectable>> collectables_;
  Readiness readiness_;
  int port_ = 0;
  std::unique_ptr<Server> server_;  // last: its thread stops before the members it uses go
};

}  // namespace ddprun
