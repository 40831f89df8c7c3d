// The etcd rendezvous backend's own record in etcd (docs/etcd.md), both ways: the driver's
// snapshot of the state (ddprun.v1.RendezvousSnapshot). Pure conversions, unit-tested without etcd.
#pragma once

#include <cstdint>
#include <string>

#include "ddprun/v1/etcd_rendezvous.pb.h"
#include "ddprun/v1/rendezvous.pb.h"
#include "rendezvous/rules/state_machine.h"

namespace ddprun::etcd_records {

// The notices themselves are ddprun.v1.ServerMessage (notice_proto.h), a node's Join and events
// ddprun.v1.AgentMessage (agent_proto.h), converted as the gRPC backend's are. The snapshot's
// nodes are Joins too (agent_proto.h's NodeInfo conversion). Where each lives: etcd_keys.h.

v1::RendezvousSnapshot toProto(const RendezvousState::Snapshot& snapshot, uint64_t noticeSeq);
RendezvousState::Snapshot fromProto(const v1::RendezvousSnapshot& message);

}  // namespace ddprun::etcd_records
