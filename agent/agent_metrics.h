// The agent's metrics port (ddprun --metrics_port, PET_METRICS_PORT; README "Metrics"): its
// workers by state, restarts, failures by cause, hangs and stragglers seen, and each local rank's
// last step time and heartbeat age, read from the agent's events (agent_events.h); the process's
// own metrics; /healthz, and /readyz (this node's workers run). Prometheus types stay in the .cc:
// a build without prometheus-cpp compiles agent_metrics_off.cc, whose constructor refuses.
#pragma once

#include <memory>
#include <string>

#include "agent/agent_events.h"
#include "common/metrics_port.h"

namespace ddprun {

class AgentMetrics final : public AgentObserver {
 public:
  // Local ranks with series of their own (step time, heartbeat age): a node runs at most this
  // many workers in practice; ranks past it are counted in the totals only.
  static constexpr int kMaxRankSeries = 64;

  // Serves at once; throws ConfigError when the port cannot be served, or this build has no metrics.
  AgentMetrics(MetricsPortOptions options, int localWorldSize);
  ~AgentMetrics() override;

  std::string address() const;
  void onEvent(const AgentEvent& event) override;
  void onStep(int localRank, double seconds) override;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun
