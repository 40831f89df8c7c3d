#include "rendezvous/rules/rules_host.h"

#include <algorithm>
#include <utility>

#include "common/exit_codes.h"

namespace ddprun {
namespace {

JobEvent event(JobEvent::Kind kind, std::string node = {}) {
  JobEvent e;
  e.kind = kind;
  e.node = std::move(node);
  return e;
}

bool isFailure(const JobEvent& e) {
  using K = JobEvent::Kind;
  return e.kind == K::kWorkerFailed || e.kind == K::kNodeLost || e.kind == K::kNodeFenced ||
         e.kind == K::kNodeExcluded || (e.kind == K::kJobEnded && !e.succeeded);
}

}  // namespace

void Effects::append(Effects more) {
  for (auto& n : more.notices) notices.push_back(std::move(n));
  for (uint64_t r : more.roundsStarted) {
    if (roundsStarted.empty() || roundsStarted.back() != r) roundsStarted.push_back(r);
  }
  jobEnded = jobEnded || more.jobEnded;
  storeDrops.roundsBelow = std::max(storeDrops.roundsBelow, more.storeDrops.roundsBelow);
  storeDrops.run = storeDrops.run || more.storeDrops.run;
  for (auto& e : more.events) events.push_back(std::move(e));
  if (more.heartbeatGap) heartbeatGap = more.heartbeatGap;
}

RulesHost::RulesHost(std::string runId, RendezvousRules rules, Micros now)
    : runId_(runId), state_(std::move(runId), rules, now), gatheringSince_(now) {}

RulesHost::RulesHost(const RendezvousState::Snapshot& snapshot, Micros now, uint64_t lastEventSeq,
                     std::optional<JobEvent> lastFailure)
    : runId_(snapshot.job.runId),
      state_(RendezvousState::restore(snapshot, now)),
      nextSeq_(lastEventSeq + 1),
      gatheringSince_(now),
      lastFailure_(std::move(lastFailure)) {}

void RulesHost::addEvents(const Before& b, std::vector<JobEvent> first, EventCause cause, Micros now, Effects* fx) {
  using K = JobEvent::Kind;
  std::vector<JobEvent> out = std::move(first);
  const RoundInterruption* interruption = nullptr;
  const JobEnd* end = nullptr;
  for (const auto& n : fx->notices) {
    if (auto* r = std::get_if<Rejection>(&n.body)) {
      if (r->code == RejectCode::kEvicted) {
        out.push_back(event(K::kNodeLost, n.nodeId));
        out.back().reason = r->message;
      } else if (r->code == RejectCode::kExcluded) {
        out.push_back(event(K::kNodeExcluded, n.nodeId));
        out.back().reason = r->message;
        if (cause == EventCause::kWorkerExit || cause == EventCause::kSignal || cause == EventCause::kHang) {
          cause = EventCause::kExcluded;  // the failure excluded its node: that is why the round stops
        }
      } else if (r->code == RejectCode::kStaleRound && !r->fatal) {
        out.push_back(event(K::kNodeFenced, n.nodeId));
        out.back().reason = r->message;
      }
    } else if (auto* i = std::get_if<RoundInterruption>(&n.body); i && !interruption) {
      interruption = i;
    } else if (auto* j = std::get_if<JobEnd>(&n.body); j && !end) {
      end = j;
    }
  }
  const auto phase = state_.phase();
  const bool interrupted = b.phase == RendezvousState::Phase::kRunning && phase != RendezvousState::Phase::kClosed &&
                           (phase == RendezvousState::Phase::kGathering || state_.round() != b.round);
  if (interrupted) {
    JobEvent e = event(K::kRoundInterrupted);
    e.round = b.round;
    e.cause = cause;
    e.restartSpent = state_.restartCount() > b.restartCount;
    e.restartCount = state_.restartCount();
    e.reason = interruption ? interruption->reason : eventCauseName(cause);
    out.push_back(std::move(e));
    gatheringSince_ = now;
  }
  if (state_.round() != b.round && phase == RendezvousState::Phase::kRunning) {
    JobEvent e = event(K::kRoundFormed);
    e.round = state_.round();
    e.members = state_.members();
    e.restartCount = state_.restartCount();
    e.took = now - gatheringSince_;
    out.push_back(std::move(e));
  }
  if (phase == RendezvousState::Phase::kClosed && b.phase != RendezvousState::Phase::kClosed) {
    JobEvent e = event(K::kJobEnded);
    e.round = state_.round();
    e.restartCount = state_.restartCount();
    if (end) {
      e.succeeded = end->succeeded;
      e.reason = end->reason;
      e.failure = end->failure;
      e.node = end->failedNode;
    }
    e.exitStatus = e.succeeded ? kExitSuccess : e.failure ? e.failure->exitStatus : kExitInfrastructure;
    out.push_back(std::move(e));
  }
  for (auto& e : out) {
    e.seq = nextSeq_++;
    e.at = now;
    if (isFailure(e)) lastFailure_ = e;
    fx->events.push_back(std::move(e));
  }
}

Effects RulesHost::effectsOf(std::vector<Notice> notices) const {
  Effects fx;
  for (const auto& n : notices) {
    if (auto* a = std::get_if<RoundAssignment>(&n.body)) {
      if (fx.roundsStarted.empty() || fx.roundsStarted.back() != a->round) fx.roundsStarted.push_back(a->round);
    }
    if (std::holds_alternative<JobEnd>(n.body)) fx.jobEnded = true;
  }
  // Rounds only grow: the newest round's store is the only one a worker may still use.
  if (!fx.roundsStarted.empty()) fx.storeDrops.roundsBelow = fx.roundsStarted.back();
  fx.storeDrops.run = fx.jobEnded;
  fx.notices = std::move(notices);
  return fx;
}

Effects RulesHost::join(const Admitted& admitted, Micros now) {
  const std::string& id = admitted.node.nodeId;
  if (!(admitted.rules == state_.rules())) {
    return effectsOf({{id, Rejection{RejectCode::kRulesMismatch,
                                     "job '" + runId_ + "' runs with other settings: " +
                                         RendezvousState::rulesDifference(admitted.rules, state_.rules()),
                                     true}}});
  }
  const Before b = before();
  const bool had = state_.hasNode(id);
  Effects fx = effectsOf(state_.join(admitted.node, now));
  std::vector<JobEvent> first;
  if (!had && state_.hasNode(id)) first.push_back(event(JobEvent::Kind::kNodeJoined, id));
  addEvents(b, std::move(first), EventCause::kNodeJoined, now, &fx);
  return fx;
}

Effects RulesHost::report(const std::string& nodeId, const AgentReport& r, Micros now) {
  const Before b = before();
  Effects fx;
  std::vector<JobEvent> first;
  EventCause cause = EventCause::kNone;
  switch (r.kind) {
    case AgentReport::Kind::kHeartbeat: {
      const auto seen = state_.lastSeen(nodeId);
      fx = effectsOf(state_.heartbeat(nodeId, now));
      if (seen) fx.heartbeatGap = now - *seen;
      if (r.health && state_.hasNode(nodeId)) tell(health_.update(nodeId, *r.health, now), &fx);
      return fx;  // a heartbeat changes no round: no event
    }
    case AgentReport::Kind::kWorkerFailed: {
      fx = effectsOf(state_.workerFailed(nodeId, r.round, now, r.failure));
      cause = causeOf(r.failure);
      const bool refused = std::any_of(fx.notices.begin(), fx.notices.end(), [&](const Notice& n) {
        auto* rej = std::get_if<Rejection>(&n.body);
        return n.nodeId == nodeId && rej && rej->code != RejectCode::kExcluded;
      });
      if (!refused) {
        JobEvent e = event(JobEvent::Kind::kWorkerFailed, nodeId);
        e.round = r.round;
        e.failure = r.failure;
        e.cause = cause;
        first.push_back(std::move(e));
      }
      break;
    }
    case AgentReport::Kind::kSucceeded: fx = effectsOf(state_.succeeded(nodeId, r.round, now)); break;
    case AgentReport::Kind::kWorkersStopped: fx = effectsOf(state_.stopped(nodeId, r.round, now)); break;
    case AgentReport::Kind::kLeave: return leave(nodeId, "left: " + r.reason, now, true);
    case AgentReport::Kind::kRankFinished: fx = effectsOf(state_.rankFinished(nodeId, r.round, r.rank, now)); break;
  }
  addEvents(b, std::move(first), cause, now, &fx);
  for (auto& e : fx.events) {
    if (e.kind == JobEvent::Kind::kNodeFenced && e.node == nodeId) e.round = r.round;  // the stale round
  }
  return fx;
}

Effects RulesHost::leave(const std::string& nodeId, const std::string& reason, Micros now, bool saidSo) {
  const Before b = before();
  // Once the job is over, agents going away is how it ends: no node is lost then.
  const bool wasPresent = state_.isPresent(nodeId) && b.phase != RendezvousState::Phase::kClosed;
  Effects fx = effectsOf(state_.leave(nodeId, reason, now, saidSo));
  if (!state_.hasNode(nodeId)) health_.forget(nodeId);
  std::vector<JobEvent> first;
  // A node that said it leaves while its workers still stop is out of every round now: lost now,
  // and not again when it is gone.
  if (wasPresent && !state_.isPresent(nodeId)) {
    first.push_back(event(JobEvent::Kind::kNodeLost, nodeId));
    first.back().reason = reason;
  }
  addEvents(b, std::move(first), EventCause::kNodeLost, now, &fx);
  return fx;
}

Effects RulesHost::tick(Micros now) {
  const Before b = before();
  Effects fx = effectsOf(state_.tick(now));
  addEvents(b, {}, EventCause::kNodeLost, now, &fx);
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
