// The rendezvous server's metrics port (--metrics_port; README "Metrics"): counters and
// histograms fed by the job events of the rules host (job_event.h), gauges read at each scrape
// from the service, the store and the front door, the process's own metrics, and the /healthz and
// /readyz probes. Prometheus types stay in the .cc: a build without prometheus-cpp (the wheel,
// DDPRUN_WITH_METRICS=OFF) compiles daemon_metrics_off.cc instead, whose constructor refuses.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/metrics_port.h"
#include "netguard/connection_listener.h"  // ConnectionListenerStats
#include "rendezvous/rules/job_event.h"
#include "rendezvous/server/rendezvous_service.h"  // RendezvousService::JobGauge
#include "store/core/run_scoped_store.h"  // RunScopedStore::Stats
#include "store/wire/store_wire_server.h"  // StoreWireServerStats

namespace ddprun {

// Read at each scrape, outside every lock of the metrics.
struct DaemonGauges {
  std::size_t jobs = 0;
  std::vector<RendezvousService::JobGauge> perJob;  // at most kMaxJobSeries
  ConnectionListenerStats connections;
  RunScopedStore::Stats store;
  StoreWireServerStats storeWire;
  uint64_t timerWakeups = 0;
};

class DaemonMetrics {
 public:
  // Jobs with series of their own (label run_id: Prometheus gives "job" to the scrape target);
  // the events of any further job count under run_id="_other", so
  // that a daemon serving many jobs keeps its series bounded. No series is per node or per rank.
  static constexpr std::size_t kMaxJobSeries = 256;

  // Serves at once. `ready`: /readyz (the rendezvous accepts joins). Throws ConfigError when the
  // port cannot be served, or when this build has no metrics.
  DaemonMetrics(MetricsPortOptions options, std::function<DaemonGauges()> gauges, std::function<bool()> ready);
  ~DaemonMetrics();
  DaemonMetrics(const DaemonMetrics&) = delete;
  DaemonMetrics& operator=(const DaemonMetrics&) = delete;

  // host:port of the metrics port.
  std::string address() const;

  // Any thread, never under the caller's lock (the service calls them outside its own).
  void onEvents(const std::string& runId, const std::vector<JobEvent>& events);
  void onHeartbeatGap(Micros gap);
  // The daemon forgot the job: its series go.
  void onJobGone(const std::string& runId);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun
