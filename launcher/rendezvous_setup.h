// The decisions that take several flags at once: one node or many, which rendezvous backend,
// where it is and who hosts it, the run id and MASTER_ADDR. Pure; whether the chosen endpoint
// resolves is checked separately (checkResolvable), as it asks the resolver.
#pragma once

#include <functional>
#include <string>

#include "launcher/launch_config.h"

namespace ddprun {

// --node_rank: an integer below the largest node count of --nnodes.
int parseNodeRank(const std::string& value, int maxNodes);

// What decideRendezvous needs besides the parsed flags already in the LaunchConfig.
struct RendezvousFlags {
  std::string runId;   // --rdzv_id as typed; empty when not given
  std::string nnodes;  // --nnodes as typed, for messages
  std::function<std::string()> freshRunId;  // a standalone job's id when none is given
};

// From cfg's standalone, rdzvBackend, rdzvEndpoint, minNodes, maxNodes,
// nodeRank, masterAddr, masterPort and localAddr, sets runId, multiNode, endpointHost,
// endpointPort and isHost, and for --standalone minNodes, maxNodes and masterAddr.
// Throws ConfigError on a combination that cannot work.
void decideRendezvous(LaunchConfig& cfg, const RendezvousFlags& flags);

// Throws ConfigError naming `host` when it does not resolve, so that a typo fails at once.
void checkResolvable(const std::string& host);

// A version-4 UUID, as torchrun's str(uuid.uuid4()).
std::string randomRunId();

}  // namespace ddprun
