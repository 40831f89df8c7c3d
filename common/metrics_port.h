// Where a metrics port listens (--metrics_port, --metrics_bind): the daemon's and the agent's.
#pragma once

#include <string>

namespace ddprun {

struct MetricsPortOptions {
  int port = -1;                          // -1: no metrics port; 0: any free port
  std::string bindAddress = "127.0.0.1";  // loopback unless told (a Kubernetes probe needs the pod address)
};

}  // namespace ddprun
