#include "rendezvous/etcd_records.h"

#include "rendezvous/worker_failure_message.h"

namespace ddprun::etcd_records {

namespace pb = ddprun::v1;

namespace {

int64_t us(Micros t) { return t.count(); }

}  // namespace

std::string storePrefix(const std::string& runId, uint64_t round) {
  return "/run/" + runId + "/round/" + std::to_string(round) + "/";
}



pb::ServerMessage toProto(const std::string& runId, const Notice& notice) {
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
  } else if (auto* r = std::get_if<Rejection>(&notice.body)) {
    msg.mutable_rejected()->set_code(toProto(r->code));
    msg.mutable_rejected()->set_message(r->message.substr(0, 1024));
    msg.mutable_rejected()->set_fatal(r->fatal);
  }
  return msg;
}


void toProto(const RendezvousRules& rules, pb::JobRules* r) {
  r->set_min_nodes(rules.minNodes);
  r->set_max_nodes(rules.maxNodes);
  r->set_max_restarts(rules.maxRestarts);
  r->set_join_timeout_ms(static_cast<uint32_t>(us(rules.joinTimeout) / 1000));
  r->set_last_call_timeout_ms(static_cast<uint32_t>(us(rules.lastCallTimeout) / 1000));
  r->set_heartbeat_timeout_ms(static_cast<uint32_t>(us(rules.heartbeatTimeout) / 1000));
}

RendezvousRules fromProto(const pb::JobRules& r) {
  RendezvousRules rules;
  rules.minNodes = r.min_nodes();
  rules.maxNodes = r.max_nodes();
  rules.maxRestarts = r.max_restarts();
  rules.joinTimeout = std::chrono::milliseconds(r.join_timeout_ms());
  rules.lastCallTimeout = std::chrono::milliseconds(r.last_call_timeout_ms());
  rules.heartbeatTimeout = std::chrono::milliseconds(r.heartbeat_timeout_ms());
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
  }
  return pb::Rejected::UNSPECIFIED;
}

pb::RendezvousSnapshot toProto(const RendezvousState::Snapshot& s, uint64_t noticeSeq) {
  pb::RendezvousSnapshot m;
  m.set_run_id(s.runId);
  toProto(s.rules, m.mutable_rules());
  m.set_phase(static_cast<pb::RendezvousSnapshot::Phase>(s.phase));
  for (const auto& n : s.nodes) {
    auto* out = m.add_nodes();
    out->mutable_join()->set_node_id(n.info.nodeId);
    out->mutable_join()->set_local_world_size(n.info.localWorldSize);
    out->mutable_join()->set_host(n.info.host);
    out->mutable_join()->set_master_port(n.info.masterPort);
    out->mutable_join()->set_node_rank(n.info.nodeRank);
    out->mutable_join()->set_last_round(n.info.lastRound);
    out->set_join_seq(n.joinSeq);
    out->set_group_rank(n.groupRank);
  }
  for (const auto& id : s.members) m.add_members(id);
  for (const auto& id : s.succeededMembers) m.add_succeeded_members(id);
  m.set_round(s.round);
  m.set_restart_count(s.restartCount);
  m.set_next_join_seq(s.nextJoinSeq);
  m.set_close_at_once(s.closeAtOnce);
  m.set_join_deadline_left_us(us(s.joinDeadlineLeft));
  m.set_has_last_call(s.lastCallDeadlineLeft.has_value());
  if (s.lastCallDeadlineLeft) m.set_last_call_left_us(us(*s.lastCallDeadlineLeft));
  m.set_notice_seq(noticeSeq);
  return m;
}

RendezvousState::Snapshot fromProto(const pb::RendezvousSnapshot& m) {
  RendezvousState::Snapshot s;
  s.runId = m.run_id();
  s.rules = fromProto(m.rules());
  s.phase = static_cast<RendezvousState::Phase>(m.phase());
  for (const auto& n : m.nodes()) {
    RendezvousState::SnapshotNode node;
    node.info.nodeId = n.join().node_id();
    node.info.localWorldSize = n.join().local_world_size();
    node.info.host = n.join().host();
    node.info.masterPort = n.join().master_port();
    node.info.nodeRank = n.join().node_rank();
    node.info.lastRound = n.join().last_round();
    node.joinSeq = n.join_seq();
    node.groupRank = n.group_rank();
    s.nodes.push_back(node);
  }
  s.members.assign(m.members().begin(), m.members().end());
  s.succeededMembers.assign(m.succeeded_members().begin(), m.succeeded_members().end());
  s.round = m.round();
  s.restartCount = m.restart_count();
  s.nextJoinSeq = m.next_join_seq();
  s.closeAtOnce = m.close_at_once();
  s.joinDeadlineLeft = Micros(m.join_deadline_left_us());
  if (m.has_last_call()) s.lastCallDeadlineLeft = Micros(m.last_call_left_us());
  return s;
}

}  // namespace ddprun::etcd_records
