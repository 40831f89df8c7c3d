#include "launcher/backend/backend.h"

namespace ddprun {

// Node 0 hosts at --master_addr:--master_port (rendezvous_setup.cc made that the endpoint) and
// is MASTER_ADDR unless --local_addr says otherwise; every node's group rank is its --node_rank.
MultiNodeRendezvous startStatic(const LaunchConfig& cfg, PostFn post, FenceFn fence) {
  backend_detail::GrpcPlacement placement;
  placement.host = cfg.isHost;
  placement.nodeRank = cfg.nodeRank;
  placement.address = !cfg.localAddr.empty() ? cfg.localAddr : (cfg.nodeRank == 0 ? cfg.masterAddr : "");
  return backend_detail::startGrpcClient(cfg, placement, std::move(post), std::move(fence));
}

}  // namespace ddprun
