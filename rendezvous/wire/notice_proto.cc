#include "rendezvous/wire/notice_proto.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "common/exit_codes.h"
#include "common/store_prefix.h"
#include "common/strings.h"
#include "rendezvous/wire/worker_failure_message.h"
#include "rpc/grpc_util.h"

namespace ddprun {

namespace pb = ddprun::v1;

namespace {
uint32_t millis(Micros t) { return static_cast<uint32_t>(std::chrono::duration_cast<std::chrono::milliseconds>(t).count()); }
}  // namespace

void toProto(const RendezvousRules& rules, pb::JobRules* r) {
  r->set_min_nodes(rules.minNodes);
  r->set_max_nodes(rules.maxNodes);
  r->set_max_restarts(rules.maxRestarts);
  r->set_join_timeout_ms(millis(rules.joinTimeout));
  r->set_last_call_timeout_ms(millis(rules.lastCallTimeout));
  r->set_heartbeat_timeout_ms(millis(rules.heartbeatTimeout));
  r->set_exclude_node_after(rules.excludeNodeAfter);
}

RendezvousRules fromProto(const pb::JobRules& r) {
  RendezvousRules rules;
  rules.minNodes = r.min_nodes();
  rules.maxNodes = r.max_nodes();
  rules.maxRestarts = r.max_restarts();
  rules.joinTimeout = std::chrono::milliseconds(r.join_timeout_ms());
  rules.lastCallTimeout = std::chrono::milliseconds(r.last_call_timeout_ms());
  rules.heartbeatTimeout = std::chrono::milliseconds(r.heartbeat_timeout_ms());
  rules.excludeNodeAfter = r.exclude_node_after();
  return rules;
}

pb::Rejected::Code toProto(RejectCode code) {
  switch (code) {
    case RejectCode::kStaleRound: return pb::Rejected::STALE_ROUND;
    case RejectCode::kDuplicateNode: return pb::Rejected::DUPLICATE_NODE;
    case RejectCode::kJobClosed: return pb::Rejected::JOB_CLOSED;
    case RejectCode::kRulesMismatch: return pb::Rejected::RULES_MISMATCH;
    case RejectCode::kMalformed: return pb::Rejected::MALFORMED;
    case RejectCode::kNotJoined: return pb::Rejected::NOT_JOINED;
    case RejectCode::kEvicted: return pb::Rejected::EVICTED;
    case RejectCode::kExcluded: return pb::Rejected::EXCLUDED;
  }
  return pb::Rejected::UNSPECIFIED;
}

pb::ServerMessage toProto(const std::string& runId, const Notice& notice, Liveness liveness) {
  pb::ServerMessage msg;
  if (auto* a = std::get_if<RoundAssignment>(&notice.body)) {
    auto* out = msg.mutable_round_assigned();
    out->set_round(a->round);
    out->set_group_rank(a->groupRank);
    out->set_group_world_size(a->groupWorldSize);
    out->set_rank_offset(a->rankOffset);
    out->set_world_size(a->worldSize);
    out->set_restart_count(a->restartCount);
    out->set_master_addr(a->masterAddr);
    out->set_master_port(a->masterPort);
    out->set_store_prefix(storePrefix(runId, a->round));
    out->set_acks_heartbeats(liveness == Liveness::kAnsweredHeartbeats);
    out->set_awaits_stopped(true);  // both backends apply RendezvousState::stopped
    out->set_relays_finish(true);   // and RendezvousState::rankFinished
  } else if (auto* i = std::get_if<RoundInterruption>(&notice.body)) {
    msg.mutable_round_interrupted()->set_round(i->round);
    msg.mutable_round_interrupted()->set_reason(i->reason);
  } else if (auto* e = std::get_if<JobEnd>(&notice.body)) {
    msg.mutable_job_closed()->set_succeeded(e->succeeded);
    msg.mutable_job_closed()->set_reason(e->reason);
    if (e->failure) {
      toMessage(*e->failure, msg.mutable_job_closed()->mutable_failure());
      msg.mutable_job_closed()->set_failed_node(e->failedNode);
    }
  } else if (auto* h = std::get_if<JobHealthView>(&notice.body)) {
    auto* out = msg.mutable_job_health();
    for (const auto& s : h->stragglers) {
      auto* st = out->add_stragglers();
      st->set_rank(s.rank);
      st->set_seconds(s.seconds);
      st->set_node(s.node);
    }
    out->set_median_seconds(h->medianSeconds);
    out->set_ranks(h->ranks);
    for (const auto& [section, longest] : h->sections) {
      auto* b = out->add_sections();
      b->set_section(section);
      b->set_longest_ms(static_cast<uint32_t>(std::min<int64_t>(longest.count(), UINT32_MAX)));
    }
  } else if (auto* f = std::get_if<PeerFinish>(&notice.body)) {
    msg.mutable_peer_finished()->set_round(f->round);
    msg.mutable_peer_finished()->set_rank(f->rank);
    msg.mutable_peer_finished()->set_node(f->node);
  } else if (auto* r = std::get_if<Rejection>(&notice.body)) {
    msg.mutable_rejected()->set_code(toProto(r->code));
    msg.mutable_rejected()->set_message(bounded(grpc::Status(grpc::StatusCode::UNKNOWN, r->message)).error_message());
    msg.mutable_rejected()->set_fatal(r->fatal);
  }
  return msg;
}

JobHealthView jobHealthOf(const pb::JobHealth& m) {
  JobHealthView view;
  for (const auto& s : m.stragglers()) {
    if (view.stragglers.size() == 1024) break;  // what the server sends is bounded too; so is this
    if (!(s.seconds() >= 0 && s.seconds() <= 86400)) continue;
    view.stragglers.push_back(StragglerInfo{s.rank(), s.seconds(), printable(s.node(), 256)});
  }
  view.medianSeconds = m.median_seconds() >= 0 && m.median_seconds() <= 86400 ? m.median_seconds() : 0;
  view.ranks = std::max(0, m.ranks());
  for (const auto& b : m.sections()) {
    if (view.sections.size() == 32) break;
    view.sections[printable(b.section(), 64)] = std::chrono::milliseconds(b.longest_ms());
  }
  return view;
}

JobClosure jobClosureOf(const pb::JobClosed& closed) {
  JobClosure closure;
  closure.outcome = closed.succeeded() ? JobOutcome::kSucceeded : JobOutcome::kFailed;
  closure.reason = closed.reason();
  if (!closed.succeeded() && closed.has_failure()) {
    closure.failure = fromMessage(closed.failure());
    closure.failedNode = closed.failed_node().substr(0, 256);
  }
  return closure;
}

int exitStatusOfRefusal(pb::Rejected::Code code) {
  const bool configuration = code == pb::Rejected::MALFORMED || code == pb::Rejected::RULES_MISMATCH ||
                             code == pb::Rejected::DUPLICATE_NODE;
  if (code == pb::Rejected::EXCLUDED) return kExitExcluded;
  return configuration ? kExitUsage : kExitInfrastructure;
}

v1::ServerMessage toProto(const std::string& runId, const Notice& notice, Liveness liveness,
                          const RendezvousState& state, uint64_t eventSeq) {
  v1::ServerMessage msg = toProto(runId, notice, liveness);
  msg.set_event_seq(eventSeq);
  if (msg.has_round_assigned() && state.members().size() <= kMembersInAssignment) {
    for (const auto& m : state.members()) msg.mutable_round_assigned()->add_members(m);
  }
  return msg;
}

RoundInfo roundInfoOf(const pb::RoundAssigned& a, const std::string& storeAddr) {
  RoundInfo info;
  info.round = a.round();
  info.groupRank = a.group_rank();
  info.groupWorldSize = a.group_world_size();
  info.rankOffset = a.rank_offset();
  info.worldSize = a.world_size();
  info.restartCount = a.restart_count();
  info.masterAddr = a.master_addr();
  info.masterPort = a.master_port();
  info.storeAddr = storeAddr;
  info.storePrefix = a.store_prefix();
  constexpr int kMaxMembers = 64;  // kMembersInAssignment: a server that sends more is not believed
  if (a.members_size() <= kMaxMembers) {
    for (const auto& m : a.members()) info.members.push_back(printable(m, 256));
  }
  return info;
}

}  // namespace ddprun
