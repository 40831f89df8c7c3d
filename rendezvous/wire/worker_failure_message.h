// A WorkerFailure and its wire form (ddprun.v1.WorkerFailed), both ways. What comes off the network
// is made valid on the way in: a status outside 1..255 becomes 1, a description is cut at 256 bytes
// and its control characters replaced (it is logged).
#pragma once

#include "ddprun/v1/rendezvous.pb.h"
#include "rendezvous/rules/worker_failure.h"

namespace ddprun {

void toMessage(const WorkerFailure& failure, v1::WorkerFailed* message);
WorkerFailure fromMessage(const v1::WorkerFailed& message);

}  // namespace ddprun
