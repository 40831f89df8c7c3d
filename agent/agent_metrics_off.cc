// DDPRUN_WITH_METRICS=OFF, asked for at configure (docs/install.md): no metrics port.
#include "agent/agent_metrics.h"
#include "common/error.h"

namespace ddprun {

class AgentMetrics::Impl {};

AgentMetrics::AgentMetrics(MetricsPortOptions, int) {
  throw ConfigError(
      "--metrics_port: this build of ddprun has no metrics port (configured with DDPRUN_WITH_METRICS=OFF); "
      "use the wheel, the .deb or a build with it on (docs/install.md)");
}
AgentMetrics::~AgentMetrics() = default;
std::string AgentMetrics::address() const { return {}; }
void AgentMetrics::onEvent(const AgentEvent&) {}
void AgentMetrics::onStep(int, double) {}

}  // namespace ddprun
