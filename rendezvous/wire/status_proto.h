// A job's status (the read-only Status call, `ddprun-rdzv status`) as a ddprun.v1.JobStatus: one
// conversion for the gRPC server, which reads its rules hosts, and for an etcd job, whose state
// is read back from etcd's records.
#pragma once

#include <cstddef>
#include <optional>

#include "ddprun/v1/rendezvous.pb.h"
#include "rendezvous/rules/job_event.h"
#include "rendezvous/rules/state_machine.h"

namespace ddprun {

// Nodes listed per job when a request does not say, and at most whatever it says: a 10,000-node
// job's whole list is about a megabyte, under every message limit on the way.
inline constexpr std::size_t kStatusDefaultNodes = 1000;
inline constexpr std::size_t kStatusMaxNodes = 10000;

// The nodes a request asks for, bounded as above.
std::size_t statusNodeLimit(uint32_t requested);

// `state` at `now` (its clock), with the job's newest failure and event count when known.
void toProto(const RendezvousState& state, Micros now, std::size_t maxNodes, const std::optional<JobEvent>& lastFailure,
             uint64_t events, v1::JobStatus* out);

// "running", "standby", "gathering", "stopping", "leaving": a node's state in the status call
// and the nodes-by-state metric.
const char* nodeStateName(RendezvousState::NodeState state);

// A job event as the status call (and the etcd snapshot) carries it; `now` on the event's clock
// gives its age (nullopt: no age, another host's clock).
void toProto(const JobEvent& event, std::optional<Micros> now, v1::JobEventSummary* out);
// Back, as far as a summary says (the snapshot's last failure): kind, cause, node, round, message
// as the reason, the worker's rank, code and signal.
JobEvent fromProto(const v1::JobEventSummary& summary);

// "gathering", "running", "closed".
const char* phaseName(RendezvousState::Phase phase);

}  // namespace ddprun
