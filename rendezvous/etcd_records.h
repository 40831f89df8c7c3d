// The etcd rendezvous backend's records in etcd (docs/etcd.md), both ways: the notices the
// driver writes for each node (ddprun.v1.ServerMessage, as the gRPC server sends them), the
// rules a node joins with (JobRules, in milliseconds) and the driver's snapshot of the state
// (ddprun.v1.RendezvousSnapshot). Pure conversions, unit-tested without etcd.
#pragma once

#include <cstdint>
#include <string>

#include "ddprun/v1/etcd_rendezvous.pb.h"
#include "ddprun/v1/rendezvous.pb.h"
#include "rendezvous/state_machine.h"

namespace ddprun::etcd_records {

// "/run/<id>/round/<n>/": the workers' store prefix of a round (DDPRUN_STORE_PREFIX).
std::string storePrefix(const std::string& runId, uint64_t round);

v1::ServerMessage toProto(const std::string& runId, const Notice& notice);
v1::Rejected::Code toProto(RejectCode code);

void toProto(const RendezvousRules& rules, v1::JobRules* message);
RendezvousRules fromProto(const v1::JobRules& message);

v1::RendezvousSnapshot toProto(const RendezvousState::Snapshot& snapshot, uint64_t noticeSeq);
RendezvousState::Snapshot fromProto(const v1::RendezvousSnapshot& message);

}  // namespace ddprun::etcd_records
