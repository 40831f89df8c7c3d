#include "rendezvous/rules/rules_host.h"

#include <utility>

namespace ddprun {

void Effects::append(Effects more) {
  for (auto& n : more.notices) notices.push_back(std::move(n));
  for (uint64_t r : more.roundsStarted) {
    if (roundsStarted.empty() || roundsStarted.back() != r) roundsStarted.push_back(r);
  }
  jobEnded = jobEnded || more.jobEnded;
}

RulesHost::RulesHost(std::string runId, RendezvousRules rules, Micros now)
    : runId_(runId), state_(std::move(runId), rules, now) {}

RulesHost::RulesHost(const RendezvousState::Snapshot& snapshot, Micros now)
    : runId_(snapshot.runId), state_(RendezvousState::restore(snapshot, now)) {}

Effects RulesHost::effectsOf(std::vector<Notice> notices) const {
  Effects fx;
  for (const auto& n : notices) {
    if (auto* a = std::get_if<RoundAssignment>(&n.body)) {
      if (fx.roundsStarted.empty() || fx.roundsStarted.back() != a->round) fx.roundsStarted.push_back(a->round);
    }
    if (std::holds_alternative<JobEnd>(n.body)) fx.jobEnded = true;
  }
  fx.notices = std::move(notices);
  return fx;
}

Effects RulesHost::join(const Admitted& admitted, Micros now) {
  if (!(admitted.rules == state_.rules())) {
    return effectsOf({{admitted.node.nodeId,
                       Rejection{RejectCode::kRulesMismatch,
                                 "job '" + runId_ + "' runs with other settings: " +
                                     RendezvousState::rulesDifference(admitted.rules, state_.rules()),
                                 true}}});
  }
  return effectsOf(state_.join(admitted.node, now));
}

Effects RulesHost::report(const std::string& nodeId, const AgentReport& r, Micros now) {
  switch (r.kind) {
    case AgentReport::Kind::kHeartbeat: {
      Effects fx = effectsOf(state_.heartbeat(nodeId, now));
      if (r.health && state_.hasNode(nodeId)) tell(health_.update(nodeId, *r.health, now), &fx);
      return fx;
    }
    case AgentReport::Kind::kWorkerFailed: return effectsOf(state_.workerFailed(nodeId, r.round, now, r.failure));
    case AgentReport::Kind::kSucceeded: return effectsOf(state_.succeeded(nodeId, r.round, now));
    case AgentReport::Kind::kWorkersStopped: return effectsOf(state_.stopped(nodeId, r.round, now));
    case AgentReport::Kind::kLeave: return effectsOf(state_.leave(nodeId, "left: " + r.reason, now, true));
    case AgentReport::Kind::kRankFinished: return effectsOf(state_.rankFinished(nodeId, r.round, r.rank, now));
  }
  return {};
}

Effects RulesHost::leave(const std::string& nodeId, const std::string& reason, Micros now, bool saidSo) {
  Effects fx = effectsOf(state_.leave(nodeId, reason, now, saidSo));
  if (!state_.hasNode(nodeId)) health_.forget(nodeId);
  return fx;
}

Effects RulesHost::tick(Micros now) {
  Effects fx = effectsOf(state_.tick(now));
  for (const auto& id : health_.reporters()) {
    if (!state_.hasNode(id)) health_.forget(id);  // evicted or excluded by the rules meanwhile
  }
  tell(health_.tick(now), &fx);
  return fx;
}

void RulesHost::tell(const std::optional<JobHealthTold>& told, Effects* fx) const {
  if (!told) return;
  for (const auto& id : told->nodes) fx->notices.push_back(Notice{id, told->view});
}

}  // namespace ddprun
