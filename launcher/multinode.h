// The gRPC rendezvous for multi-node jobs: starts (or joins) the server and the agent's session.
// Linked only into ddprun-multinode, so that single-node ddprun loads no gRPC.
#pragma once

#include "launcher/launch.h"

namespace ddprun {

MultiNodeRendezvous startMultiNode(const LaunchConfig& config, PostFn post, FenceFn fence);

}  // namespace ddprun
