// Who may join a job, and as what: every bound and sanitizing rule of a Join, in one place, for
// every backend. The gRPC service admits a Join read from a session, the etcd driver one read
// from a node key; both then hand the admitted node to the job's RulesHost. Nothing that a node
// sent reaches a log, a store path or a worker's MASTER_ADDR before it passed here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>

#include "rendezvous/rules/state_machine.h"

namespace ddprun {

// A Join as a node sent it (decoded from the wire, not yet trusted): the job it names, the rules
// it asks for, and the node as the rules will keep it (its host empty: the backend's view of it).
struct JoinRequest {
  std::string runId;
  RendezvousRules rules;
  NodeInfo node;
};

// What the backend knows of where a Join came from.
struct JoinOrigin {
  // The address the node connected from (gRPC's peer); empty where the backend sees none (etcd).
  std::string peerHost;
  // A host that is not the peer's address is refused (else only logged): the daemon's
  // --require_host_match.
  bool requireHostMatch = false;
  // The name the backend knows the node by (etcd: its node key), which the Join's node id must
  // equal; empty where the Join's own id is all there is (gRPC).
  std::optional<std::string> keyNodeId;
  // The job the Join was written for (etcd: the key's run id); empty where the Join picks it.
  std::optional<std::string> runId;
};

struct Admitted {
  NodeInfo node;            // host filled in (the peer's when the node gave none)
  RendezvousRules rules;
  std::string warning;      // worth a log line (a host other than the peer's), or empty
};

// Admits a Join, or says why not (kMalformed, fatal; the message is safe to log and to send
// back: it never repeats what was refused).
std::variant<Admitted, Rejection> admit(const JoinRequest& join, const JoinOrigin& origin);

// The bounds of a node against its job's rules (local world size 1-1024, node rank below the
// job's max nodes, a port), or nullopt. admit() checks them against the rules the node sent;
// RendezvousState::join checks them against the job's, for callers that build a NodeInfo
// themselves (the single-node driver, the fuzzer).
std::optional<std::string> nodeBoundsProblem(const NodeInfo& node, const RendezvousRules& rules);

}  // namespace ddprun
