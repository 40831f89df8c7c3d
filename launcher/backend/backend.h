// The rendezvous backends of a multi-node job, one file each: what the agent's rendezvous client
// is, whether this node hosts a server, and what the workers need of the backend beyond
// torchrun's contract. Linked only into ddprun-multinode, so that single-node ddprun loads no
// gRPC and no protobuf.
#pragma once

#include <optional>
#include <string>

#include "launcher/launch.h"
#include "rendezvous/rules/state_machine.h"  // RendezvousRules

namespace ddprun {

// Dispatches on config.rdzvBackend (the MultiNodeStarter of ddprun-multinode).
MultiNodeRendezvous startMultiNode(const LaunchConfig& config, PostFn post, FenceFn fence);

// --rdzv_backend=static: node 0 hosts the grpc backend at --master_addr:--master_port; the group
// rank is --node_rank (static_backend.cc).
MultiNodeRendezvous startStatic(const LaunchConfig& config, PostFn post, FenceFn fence);
// --rdzv_backend=grpc|c10d: the agent that can bind the endpoint hosts it (or is_host says), the
// others connect (grpc_backend.cc).
MultiNodeRendezvous startGrpc(const LaunchConfig& config, PostFn post, FenceFn fence);
// --rdzv_backend=etcd|etcd-v2: no server of ours; the agents meet in etcd (etcd_backend.cc).
MultiNodeRendezvous startEtcd(const LaunchConfig& config, PostFn post, FenceFn fence);

namespace backend_detail {

// How a grpc-backed node joins: the static backend fixes what the elastic one leaves open.
struct GrpcPlacement {
  std::optional<bool> host;  // host the server (unset: if the endpoint is free here)
  int nodeRank = -1;         // the static group rank, -1 elastic
  std::string address;       // this node's address for MASTER_ADDR; empty: as the server sees it
};
MultiNodeRendezvous startGrpcClient(const LaunchConfig& config, const GrpcPlacement& placement, PostFn post,
                                    FenceFn fence);

// The job's rules as this node asks for them, the same for every backend.
RendezvousRules rulesOf(const LaunchConfig& config);
// Unique per agent process: host:pid:random.
std::string newNodeId();

}  // namespace backend_detail
}  // namespace ddprun
