// DDPRUN_WITH_METRICS=OFF (the wheel: Debian ships prometheus-cpp as a shared library
// only, and the wheel's binaries link nothing but glibc and libgcc_s; docs/install.md).
#include "common/error.h"
#include "rendezvous/server/daemon_metrics.h"

namespace ddprun {

class DaemonMetrics::Impl {};

DaemonMetrics::DaemonMetrics(MetricsPortOptions, std::function<DaemonGauges()>, std::function<bool()>) {
  throw ConfigError(
      "--metrics_port: this build of ddprun has no metrics port (the wheel is built without prometheus-cpp); "
      "use the .deb or a source build (docs/install.md)");
}
DaemonMetrics::~DaemonMetrics() = default;
std::string DaemonMetrics::address() const { return {}; }
void DaemonMetrics::onEvents(const std::string&, const std::vector<JobEvent>&) {}
void DaemonMetrics::onHeartbeatGap(Micros) {}
void DaemonMetrics::onJobGone(const std::string&) {}

}  // namespace ddprun
