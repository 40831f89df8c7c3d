#include "rendezvous/wire/agent_proto.h"

#include <algorithm>
#include <climits>
#include <cstdint>

#include "common/strings.h"
#include "rendezvous/wire/notice_proto.h"
#include "rendezvous/wire/worker_failure_message.h"

namespace ddprun {

namespace pb = ddprun::v1;

namespace {
constexpr size_t kMaxReasonBytes = 256;  // of a reason an agent gives for leaving
}  // namespace

NodeInfo nodeInfoOf(const pb::Join& j) {
  NodeInfo node;
  node.nodeId = j.node_id();
  node.localWorldSize = j.local_world_size();
  node.host = j.host();
  node.masterPort = j.master_port();
  node.nodeRank = j.node_rank();
  node.lastRound = j.last_round();
  node.reportsStopped = j.reports_stopped();
  return node;
}

void toProto(const NodeInfo& node, pb::Join* j) {
  j->set_node_id(node.nodeId);
  j->set_local_world_size(node.localWorldSize);
  j->set_host(node.host);
  j->set_master_port(node.masterPort);
  j->set_node_rank(node.nodeRank);
  j->set_last_round(node.lastRound);
  j->set_has_last_round(node.lastRound > 0);
  j->set_reports_stopped(node.reportsStopped);
}

JoinRequest joinRequestOf(const pb::Join& j) { return JoinRequest{j.run_id(), fromProto(j.rules()), nodeInfoOf(j)}; }

void toProto(const JoinRequest& r, pb::Join* j) {
  toProto(r.node, j);
  j->set_run_id(r.runId);
  toProto(r.rules, j->mutable_rules());
}

std::optional<AgentReport> reportOf(const pb::AgentMessage& m) {
  AgentReport r;
  switch (m.kind_case()) {
    case pb::AgentMessage::kHeartbeat:
      r.kind = AgentReport::Kind::kHeartbeat;
      r.round = m.heartbeat().round();
      if (m.heartbeat().has_health()) {
        // Bounded again by the rules host (JobHealth); here only what cannot be a value.
        NodeHealth h;
        for (const auto& t : m.heartbeat().health().step_times()) {
          if (h.stepSeconds.size() == 1024) break;
          if (t.rank() >= 0 && t.seconds() >= 0 && t.seconds() <= 86400) h.stepSeconds[t.rank()] = t.seconds();
        }
        for (const auto& b : m.heartbeat().health().sections()) {
          if (h.sections.size() == 32) break;
          h.sections[printable(b.section(), 64)] = std::chrono::milliseconds(b.longest_ms());
        }
        r.health = std::move(h);
      }
      return r;
    case pb::AgentMessage::kWorkerFailed:
      r.kind = AgentReport::Kind::kWorkerFailed;
      r.round = m.worker_failed().round();
      r.failure = fromMessage(m.worker_failed());
      return r;
    case pb::AgentMessage::kSucceeded:
      r.kind = AgentReport::Kind::kSucceeded;
      r.round = m.succeeded().round();
      return r;
    case pb::AgentMessage::kWorkersStopped:
      r.kind = AgentReport::Kind::kWorkersStopped;
      r.round = m.workers_stopped().round();
      return r;
    case pb::AgentMessage::kRankFinished:
      r.kind = AgentReport::Kind::kRankFinished;
      r.round = m.rank_finished().round();
      r.rank = m.rank_finished().rank();
      return r;
    case pb::AgentMessage::kLeave:
      r.kind = AgentReport::Kind::kLeave;
      r.reason = printable(m.leave().reason(), kMaxReasonBytes);
      return r;
    default:
      return std::nullopt;
  }
}

pb::AgentMessage toProto(const AgentReport& r) {
  pb::AgentMessage m;
  switch (r.kind) {
    case AgentReport::Kind::kHeartbeat:
      m.mutable_heartbeat()->set_round(r.round);
      if (r.health) {
        auto* h = m.mutable_heartbeat()->mutable_health();
        for (const auto& [rank, s] : r.health->stepSeconds) {
          auto* t = h->add_step_times();
          t->set_rank(rank);
          t->set_seconds(s);
        }
        for (const auto& [section, longest] : r.health->sections) {
          auto* b = h->add_sections();
          b->set_section(section);
          b->set_longest_ms(static_cast<uint32_t>(std::clamp<int64_t>(longest.count(), 0, UINT32_MAX)));
        }
      }
      break;
    case AgentReport::Kind::kWorkerFailed:
      toMessage(r.failure, m.mutable_worker_failed());
      m.mutable_worker_failed()->set_round(r.round);
      break;
    case AgentReport::Kind::kSucceeded: m.mutable_succeeded()->set_round(r.round); break;
    case AgentReport::Kind::kWorkersStopped: m.mutable_workers_stopped()->set_round(r.round); break;
    case AgentReport::Kind::kLeave: m.mutable_leave()->set_reason(r.reason); break;
    case AgentReport::Kind::kRankFinished:
      m.mutable_rank_finished()->set_round(r.round);
      m.mutable_rank_finished()->set_rank(r.rank);
      break;
  }
  return m;
}

}  // namespace ddprun
