#include "launcher/backend/backend.h"

#include <unistd.h>

#include <random>

#include "common/net.h"
#include "rpc/grpc_runtime.h"

namespace ddprun {

MultiNodeRendezvous startMultiNode(const LaunchConfig& cfg, PostFn post, FenceFn fence) {
  prepareGrpcRuntime();
  switch (cfg.rdzvBackend) {
    case RdzvBackend::kStatic: return startStatic(cfg, std::move(post), std::move(fence));
    case RdzvBackend::kGrpc: return startGrpc(cfg, std::move(post), std::move(fence));
    case RdzvBackend::kEtcd: return startEtcd(cfg, std::move(post), std::move(fence));
  }
  return startStatic(cfg, std::move(post), std::move(fence));
}

namespace backend_detail {

RendezvousRules rulesOf(const LaunchConfig& cfg) {
  auto seconds = [](double s) { return Micros(static_cast<int64_t>(s * 1e6)); };
  RendezvousRules rules;
  rules.minNodes = cfg.minNodes;
  rules.maxNodes = cfg.maxNodes;
  rules.maxRestarts = cfg.maxRestarts;
  rules.joinTimeout = seconds(cfg.joinTimeoutSeconds);
  rules.lastCallTimeout = seconds(cfg.lastCallTimeoutSeconds);
  rules.heartbeatTimeout = seconds(cfg.heartbeatTimeoutSeconds);
  rules.excludeNodeAfter = cfg.excludeNodeAfter;
  return rules;
}

std::string newNodeId() {
  return hostName() + ":" + std::to_string(::getpid()) + ":" + std::to_string(std::random_device{}() % 100000);
}

}  // namespace backend_detail
}  // namespace ddprun
