// The etcd rendezvous backend's records in etcd (docs/etcd.md), both ways: the
// rules a node joins with (JobRules, in milliseconds) and the driver's snapshot of the state
// (ddprun.v1.RendezvousSnapshot). Pure conversions, unit-tested without etcd.
#pragma once

#include <cstdint>
#include <string>

#include "ddprun/v1/etcd_rendezvous.pb.h"
#include "ddprun/v1/rendezvous.pb.h"
#include "rendezvous/state_machine.h"

namespace ddprun::etcd_records {

// The notices themselves are ddprun.v1.ServerMessage, and the rules JobRules, converted by
// rendezvous/notice_proto.h as the gRPC server's are.

v1::RendezvousSnapshot toProto(const RendezvousState::Snapshot& snapshot, uint64_t noticeSeq);
RendezvousState::Snapshot fromProto(const v1::RendezvousSnapshot& message);

}  // namespace ddprun::etcd_records
