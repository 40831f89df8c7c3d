// DDPRUN_WITH_METRICS=OFF (the wheel; docs/install.md): no metrics port.
#include "agent/agent_metrics.h"
#include "common/error.h"

namespace ddprun {

class AgentMetrics::Impl {};

AgentMetrics::AgentMetrics(MetricsPortOptions, int) {
  throw ConfigError(
      "--metrics_port: this build of ddprun has no metrics port (the wheel is built without prometheus-cpp); "
      "use the .deb or a source build (docs/install.md)");
}
AgentMetrics::~AgentMetrics() = default;
std::string AgentMetrics::address() const { return {}; }
void AgentMetrics::onEvent(const AgentEvent&) {}
void AgentMetrics::onStep(int, double) {}

}  // namespace ddprun
