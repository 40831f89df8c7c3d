#include "rendezvous/wire/status_proto.h"

#include <algorithm>
#include <chrono>

#include "rpc/grpc_util.h"

namespace ddprun {
namespace {

double seconds(Micros t) { return std::chrono::duration<double>(t).count(); }

// Bounded like every message a ddprun service sends (grpc_util.h).
std::string boundedText(const std::string& text) {
  return text.size() <= kMaxErrorMessageBytes ? text : text.substr(0, kMaxErrorMessageBytes) + "...";
}

}  // namespace

const char* nodeStateName(RendezvousState::NodeState state) {
  using S = RendezvousState::NodeState;
  switch (state) {
    case S::kRunning: return "running";
    case S::kStandby: return "standby";
    case S::kGathering: return "gathering";
    case S::kStopping: return "stopping";
    case S::kLeaving: return "leaving";
    case S::kCount: break;
  }
  return "unknown";
}

void toProto(const JobEvent& e, std::optional<Micros> now, v1::JobEventSummary* f) {
  f->set_seq(e.seq);
  f->set_kind(eventKindName(e.kind));
  f->set_node(e.node);
  f->set_round(e.round);
  f->set_cause(eventCauseName(e.cause));
  f->set_rank(e.failure ? e.failure->rank : -1);
  f->set_exit_code(e.failure ? e.failure->exitCode : -1);
  f->set_signal(e.failure ? e.failure->signal : 0);
  std::string message = e.reason;
  if (e.failure && e.kind == JobEvent::Kind::kWorkerFailed) {
    message = "rank " + std::to_string(e.failure->rank) + " " + e.failure->description;
  }
  f->set_message(boundedText(message));
  f->set_age_s(now ? seconds(*now - e.at) : -1);
}

JobEvent fromProto(const v1::JobEventSummary& f) {
  JobEvent e;
  e.seq = f.seq();
  for (int k = 0; k <= static_cast<int>(JobEvent::Kind::kJobEnded); ++k) {
    if (f.kind() == eventKindName(static_cast<JobEvent::Kind>(k))) e.kind = static_cast<JobEvent::Kind>(k);
  }
  for (int c = 0; c <= static_cast<int>(EventCause::kExcluded); ++c) {
    if (f.cause() == eventCauseName(static_cast<EventCause>(c))) e.cause = static_cast<EventCause>(c);
  }
  e.node = f.node();
  e.round = f.round();
  e.reason = f.message();
  if (f.rank() >= 0) {
    WorkerFailure w;
    w.rank = f.rank();
    w.exitCode = f.exit_code();
    w.signal = f.signal();
    // toProto wrote "rank N <description>" for a worker failure: the description is the rest.
    const std::string prefix = "rank " + std::to_string(f.rank()) + " ";
    w.description = f.message().rfind(prefix, 0) == 0 ? f.message().substr(prefix.size()) : f.message();
    e.failure = w;
  }
  return e;
}

std::size_t statusNodeLimit(uint32_t requested) {
  return requested == 0 ? kStatusDefaultNodes : std::min<std::size_t>(requested, kStatusMaxNodes);
}

const char* phaseName(RendezvousState::Phase phase) {
  switch (phase) {
    case RendezvousState::Phase::kGathering: return "gathering";
    case RendezvousState::Phase::kRunning: return "running";
    case RendezvousState::Phase::kClosed: return "closed";
  }
  return "unknown";
}

void toProto(const RendezvousState& state, Micros now, std::size_t maxNodes, const std::optional<JobEvent>& lastFailure,
             uint64_t events, v1::JobStatus* out) {
  const RendezvousRules& rules = state.rules();
  out->set_phase(phaseName(state.phase()));
  out->set_round(state.round());
  out->set_min_nodes(rules.minNodes);
  out->set_max_nodes(rules.maxNodes);
  out->set_restarts(state.restartCount());
  out->set_max_restarts(rules.maxRestarts);
  out->set_node_count(static_cast<uint32_t>(state.nodeCount()));
  out->set_members(static_cast<uint32_t>(state.members().size()));
  out->set_events(events);
  for (const auto& n : state.nodeStatus(maxNodes)) {
    v1::NodeStatus* node = out->add_nodes();
    node->set_node_id(n.nodeId);
    node->set_host(n.host);
    node->set_group_rank(state.phase() == RendezvousState::Phase::kRunning ? n.groupRank : -1);
    node->set_state(nodeStateName(n.state));
    node->set_last_heartbeat_age_s(seconds(now - n.lastSeen));
    node->set_lease_left_s(-1);
  }
  if (lastFailure) toProto(*lastFailure, now, out->mutable_last_failure());
}

}  // namespace ddprun
