// Runs a validated LaunchConfig: the event loop, signals, the supervisor, the rendezvous and the
// agent. Returns ddprun's exit status.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "launcher/cli.h"
#include "launcher/launch_config.h"
#include "rendezvous/client/rendezvous.h"
#include "store/core/store_request_sink.h"

namespace ddprun {

// The server and client of a multi-node job, from launcher/backend/. Only ddprun-multinode
// links it: single-node ddprun stays free of gRPC (and of its memory).
class HostedRendezvous {
 public:
  virtual ~HostedRendezvous() = default;
  // Gives the other agents up to `grace` to read the end of the job, then stops.
  virtual void shutdown(std::chrono::milliseconds grace) = 0;
};

struct MultiNodeRendezvous {
  std::unique_ptr<HostedRendezvous> server;  // when this node hosts the endpoint
  std::unique_ptr<Rendezvous> client;
  // What the workers need of the backend beyond torchrun's contract (etcd: the store's key root,
  // TLS files and login), added to the environment the agent gives them.
  std::vector<std::pair<std::string, std::string>> workerEnv;
  // This node's id in the job (host:pid:random): how the rendezvous, the status and the members of
  // a round name it; the timeline says it too.
  std::string nodeId;
  // The sinks torch's store (agent/torch_store.h) forwards a round's requests to: the job's store
  // at the round's store address, with the job token. Unset: the backend has no store for it
  // (etcd), and rank 0 hosts its own TCPStore.
  std::function<StoreRequestSink::Factory(const RoundInfo& round)> torchStoreSinks;
};

using PostFn = std::function<void(std::function<void()>)>;
// Hands a fencing deadline to the supervisor's watchdog (GrpcRendezvousOptions::onFenceDeadline).
using FenceFn = std::function<void(std::chrono::steady_clock::time_point)>;
using MultiNodeStarter = std::function<MultiNodeRendezvous(const LaunchConfig&, PostFn, FenceFn)>;

// startMultiNode may be null when config.multiNode is false.
int launch(const LaunchConfig& config, const MultiNodeStarter& startMultiNode);

// The whole command: parse, then dry run, launch, or (multi-node without a starter) exec the
// sibling ddprun-multinode. Maps errors to exit statuses (2 bad input, 1 otherwise).
// versionText: what --version prints (common/build_info.h).
int launcherMain(int argc, char** argv, const MultiNodeStarter& startMultiNode, const VersionText& versionText);

// --dry_run: prints the rank map and each worker's environment to stdout; starts nothing.
int printDryRun(const LaunchConfig& config);

}  // namespace ddprun
