#include "rendezvous/etcd/etcd_records.h"

#include "rendezvous/wire/agent_proto.h"
#include "rendezvous/wire/notice_proto.h"

namespace ddprun::etcd_records {

namespace pb = ddprun::v1;

namespace {

int64_t us(Micros t) { return t.count(); }

}  // namespace

pb::RendezvousSnapshot toProto(const RendezvousState::Snapshot& s, uint64_t noticeSeq) {
  const RendezvousState::JobFields& job = s.job;
  pb::RendezvousSnapshot m;
  m.set_run_id(job.runId);
  ddprun::toProto(job.rules, m.mutable_rules());
  m.set_phase(static_cast<pb::RendezvousSnapshot::Phase>(job.phase));
  for (const auto& n : s.nodes) {
    auto* out = m.add_nodes();
    ddprun::toProto(n.info, out->mutable_join());
    out->set_stopping_round(n.stoppingRound);
    out->set_leaving(n.leaving);
    out->set_join_seq(n.joinSeq);
    out->set_group_rank(n.groupRank);
  }
  for (const auto& id : job.members) m.add_members(id);
  for (const auto& id : job.succeededMembers) m.add_succeeded_members(id);
  m.set_finish_announced(job.finishAnnounced);
  m.set_round(job.round);
  m.set_restart_count(job.restartCount);
  m.set_next_join_seq(job.nextJoinSeq);
  m.set_close_at_once(job.closeAtOnce);
  for (const auto& host : job.excludedHosts) m.add_excluded_hosts(host);
  for (const auto& [host, n] : job.hostFailures) (*m.mutable_host_failures())[host] = n;
  m.set_join_deadline_left_us(us(s.joinDeadlineLeft));
  m.set_has_last_call(s.lastCallDeadlineLeft.has_value());
  if (s.lastCallDeadlineLeft) m.set_last_call_left_us(us(*s.lastCallDeadlineLeft));
  m.set_notice_seq(noticeSeq);
  return m;
}

RendezvousState::Snapshot fromProto(const pb::RendezvousSnapshot& m) {
  RendezvousState::Snapshot s;
  RendezvousState::JobFields& job = s.job;
  job.runId = m.run_id();
  job.rules = ddprun::fromProto(m.rules());
  job.phase = static_cast<RendezvousState::Phase>(m.phase());
  for (const auto& n : m.nodes()) {
    RendezvousState::SnapshotNode node;
    node.info = nodeInfoOf(n.join());
    node.stoppingRound = n.stopping_round();
    node.leaving = n.leaving();
    node.joinSeq = n.join_seq();
    node.groupRank = n.group_rank();
    s.nodes.push_back(node);
  }
  job.members.assign(m.members().begin(), m.members().end());
  job.succeededMembers.insert(m.succeeded_members().begin(), m.succeeded_members().end());
  job.finishAnnounced = m.finish_announced();
  job.round = m.round();
  job.restartCount = m.restart_count();
  job.nextJoinSeq = m.next_join_seq();
  job.closeAtOnce = m.close_at_once();
  job.excludedHosts.insert(m.excluded_hosts().begin(), m.excluded_hosts().end());
  for (const auto& [host, n] : m.host_failures()) job.hostFailures[host] = n;
  s.joinDeadlineLeft = Micros(m.join_deadline_left_us());
  if (m.has_last_call()) s.lastCallDeadlineLeft = Micros(m.last_call_left_us());
  return s;
}

}  // namespace ddprun::etcd_records
