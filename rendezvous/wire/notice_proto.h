// What the rendezvous tells a node, as a ddprun.v1.ServerMessage: one conversion for both
// backends, the gRPC server's session stream and the etcd driver's notice records.
#pragma once

#include <cstdint>
#include <string>

#include "ddprun/v1/rendezvous.pb.h"
#include "rendezvous/rules/node_view.h"
#include "rendezvous/rules/state_machine.h"

namespace ddprun {

v1::Rejected::Code toProto(RejectCode code);

// A job's rules on the wire (JobRules, in milliseconds) and back: the Join of both backends.
void toProto(const RendezvousRules& rules, v1::JobRules* message);
RendezvousRules fromProto(const v1::JobRules& message);

// How a backend knows its agents are alive, which tells an agent whether it may fence itself on a
// silent heartbeat (docs/rendezvous.md, "Fencing"): the gRPC backend answers every heartbeat; the
// etcd backend's liveness is the node's lease instead.
enum class Liveness { kAnsweredHeartbeats, kLease };

// A rejection's message is cut to 1 KB, saying so.
v1::ServerMessage toProto(const std::string& runId, const Notice& notice, Liveness liveness);
// The same, with what a notice carries beyond itself: the job's newest event number (`eventSeq`,
// the order of the agents' timelines) and, in an assignment, the members of a round of at most
// kMembersInAssignment nodes (`state`'s, read when the round was just formed).
v1::ServerMessage toProto(const std::string& runId, const Notice& notice, Liveness liveness,
                          const RendezvousState& state, uint64_t eventSeq);

// Rounds of at most this many nodes name their members in each assignment (RoundAssigned.members).
inline constexpr std::size_t kMembersInAssignment = 64;

// An agent's side: the round it was assigned, with its workers' store at `storeAddr`.
RoundInfo roundInfoOf(const v1::RoundAssigned& assigned, const std::string& storeAddr);

// An agent's side: the job-wide health view (bounded: 1024 stragglers, 32 sections).
JobHealthView jobHealthOf(const v1::JobHealth& health);

// An agent's side: how the job ended (the failed node's name cut to 256 bytes).
JobClosure jobClosureOf(const v1::JobClosed& closed);

// What a node exits with when the rendezvous refuses it for good: its configuration (other
// rules, a malformed join, a node id or rank taken) is exit 2, anything else infrastructure.
int exitStatusOfRefusal(v1::Rejected::Code code);

}  // namespace ddprun
