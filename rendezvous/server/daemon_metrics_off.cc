// DDPRUN_WITH_METRICS=OFF, asked for at configure (docs/install.md): no metrics port.
#include "common/error.h"
#include "rendezvous/server/daemon_metrics.h"

namespace ddprun {

class DaemonMetrics::Impl {};

DaemonMetrics::DaemonMetrics(MetricsPortOptions, std::function<DaemonGauges()>, std::function<bool()>) {
  throw ConfigError(
      "--metrics_port: this build of ddprun has no metrics port (configured with DDPRUN_WITH_METRICS=OFF); "
      "use the wheel, the .deb or a build with it on (docs/install.md)");
}
DaemonMetrics::~DaemonMetrics() = default;
std::string DaemonMetrics::address() const { return {}; }
void DaemonMetrics::onEvents(const std::string&, const std::vector<JobEvent>&) {}
void DaemonMetrics::onHeartbeatGap(Micros) {}
void DaemonMetrics::onJobGone(const std::string&) {}

}  // namespace ddprun
