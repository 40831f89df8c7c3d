// What an agent tells the rendezvous, as ddprun.v1.AgentMessage, both ways: one conversion for
// both backends (the gRPC session stream, etcd's node keys and event records) and for both
// sides (the agents' clients write it, the service and the etcd driver read it).
#pragma once

#include <optional>

#include "ddprun/v1/rendezvous.pb.h"
#include "rendezvous/rules/admission.h"
#include "rendezvous/rules/rules_host.h"

namespace ddprun {

// A Join as sent: nothing checked yet (admit() does that).
JoinRequest joinRequestOf(const v1::Join& join);
void toProto(const JoinRequest& join, v1::Join* message);

// A node as the rules keep it (the etcd driver's snapshot): the Join's fields but the rules.
NodeInfo nodeInfoOf(const v1::Join& join);
void toProto(const NodeInfo& node, v1::Join* message);

// A report after the Join; nullopt for a Join or an empty or unknown message. A leave's reason is
// cut to 256 printable bytes (it goes into logs and other nodes' messages).
std::optional<AgentReport> reportOf(const v1::AgentMessage& message);
v1::AgentMessage toProto(const AgentReport& report);

}  // namespace ddprun
