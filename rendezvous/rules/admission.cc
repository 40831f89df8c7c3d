#include "rendezvous/rules/admission.h"

#include "common/ids.h"
#include "common/net.h"

namespace ddprun {

namespace {

Rejection malformed(const std::string& message) { return Rejection{RejectCode::kMalformed, message, true}; }

}  // namespace

std::optional<std::string> nodeBoundsProblem(const NodeInfo& node, const RendezvousRules& rules) {
  if (node.nodeId.empty() || node.localWorldSize < 1 || node.localWorldSize > 1024 || node.nodeRank < -1 ||
      node.nodeRank >= rules.maxNodes || node.masterPort < 0 || node.masterPort > 65535) {
    return "node id, local world size (1-1024), node rank (< max nodes) or port out of range";
  }
  return std::nullopt;
}

std::variant<Admitted, Rejection> admit(const JoinRequest& join, const JoinOrigin& origin) {
  const NodeInfo& node = join.node;
  // Ids and the host first: from here on they are plain enough for logs and store paths.
  if (auto problem = idProblem(join.runId)) return malformed("invalid join: run id " + *problem);
  if (origin.runId && join.runId != *origin.runId) return malformed("invalid join: run id is not this job's");
  if (auto problem = idProblem(node.nodeId)) return malformed("invalid join: node id " + *problem);
  if (origin.keyNodeId && node.nodeId != *origin.keyNodeId) {
    return malformed("invalid join: node id is not the name of the node's key");
  }
  if (!node.host.empty()) {
    if (auto problem = hostProblem(node.host)) return malformed("invalid join: host " + *problem);
  } else if (origin.peerHost.empty()) {
    // Nobody else can say where this node is: it would reach workers as an empty MASTER_ADDR.
    return malformed("invalid join: host is empty, and this backend sees no peer address");
  }
  if (auto problem = RendezvousState::validateRules(join.rules)) return malformed("invalid job rules: " + *problem);
  if (auto problem = nodeBoundsProblem(node, join.rules)) return malformed("invalid join: " + *problem);

  Admitted out;
  out.rules = join.rules;
  out.node = node;
  if (node.host.empty()) out.node.host = origin.peerHost;
  if (!node.host.empty() && !origin.peerHost.empty() && sameAddress(node.host, origin.peerHost) == false) {
    if (origin.requireHostMatch) {
      return malformed("reported host " + node.host + " is not the address " + origin.peerHost +
                       " this node connected from");
    }
    out.warning = "node " + node.nodeId + " reports host " + node.host + " but connected from " + origin.peerHost +
                  "; it becomes MASTER_ADDR if it holds rank 0";
  }
  return out;
}

}  // namespace ddprun
