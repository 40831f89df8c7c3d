// The one rules host: what every backend does with one job's RendezvousState, written once. The
// gRPC service keeps one per job beside its sessions and streams; the etcd driver keeps one beside
// its transactions and watches. A backend decodes what an agent sent (rendezvous/wire/), admits
// a Join (admission.h), and hands it here; it gets back Effects: the notices to deliver and what
// they mean for the workers' store.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "rendezvous/rules/admission.h"
#include "rendezvous/rules/job_event.h"
#include "rendezvous/rules/job_health.h"
#include "rendezvous/rules/state_machine.h"
#include "rendezvous/rules/worker_failure.h"

namespace ddprun {

// An agent's message after its Join, decoded.
struct AgentReport {
  enum class Kind { kHeartbeat, kWorkerFailed, kSucceeded, kWorkersStopped, kLeave, kRankFinished };
  Kind kind = Kind::kHeartbeat;
  uint64_t round = 0;
  WorkerFailure failure;  // kWorkerFailed
  std::string reason;     // kLeave: why, as the agent said it (already bounded and printable)
  int rank = 0;           // kRankFinished: the global rank that exited 0
  std::optional<NodeHealth> health;  // kHeartbeat: the node's ranks' health, when it changed

  static AgentReport heartbeat(uint64_t round, std::optional<NodeHealth> health = std::nullopt) {
    AgentReport r = of(Kind::kHeartbeat, round);
    r.health = std::move(health);
    return r;
  }
  static AgentReport workerFailed(uint64_t round, WorkerFailure failure) {
    AgentReport r = of(Kind::kWorkerFailed, round);
    r.failure = std::move(failure);
    return r;
  }
  static AgentReport succeeded(uint64_t round) { return of(Kind::kSucceeded, round); }
  static AgentReport workersStopped(uint64_t round) { return of(Kind::kWorkersStopped, round); }
  static AgentReport rankFinished(uint64_t round, int rank) {
    AgentReport r = of(Kind::kRankFinished, round);
    r.rank = rank;
    return r;
  }
  static AgentReport leave(std::string reason) {
    AgentReport r = of(Kind::kLeave, 0);
    r.reason = std::move(reason);
    return r;
  }

 private:
  static AgentReport of(Kind kind, uint64_t round) {
    AgentReport r;
    r.kind = kind;
    r.round = round;
    return r;
  }
};

// What the workers' store of the job drops, decided here once for every backend (the gRPC
// service's run-scoped store, the etcd driver's keys): a new round's store is fresh and no worker
// of an older round may read or write its own any more; the job's end ends them all, so waits
// still pending fail at once ("stale round") instead of at their timeout.
struct StoreDrops {
  uint64_t roundsBelow = 0;  // every round's store below this round (0: none)
  bool run = false;          // the whole run's store: the job ended

  bool any() const { return roundsBelow > 0 || run; }
  bool operator==(const StoreDrops&) const = default;
};

// What one event decided.
struct Effects {
  std::vector<Notice> notices;
  // Rounds that started with this event, in order: each gets a fresh store prefix.
  std::vector<uint64_t> roundsStarted;
  bool jobEnded = false;  // a JobEnd is among the notices
  StoreDrops storeDrops;  // what the backend drops of the workers' store, before the notices go
  // What happened, in order, numbered by the job (job_event.h): for metrics and the status call.
  std::vector<JobEvent> events;
  // A heartbeat's gap since the node's previous message (the heartbeat lag metric).
  std::optional<Micros> heartbeatGap;

  bool empty() const { return notices.empty() && roundsStarted.empty() && !jobEnded && events.empty(); }
  void append(Effects more);
};

class RulesHost {
 public:
  RulesHost(std::string runId, RendezvousRules rules, Micros now);
  // Goes on from a predecessor's snapshot (the etcd driver's takeover), numbering events after
  // `lastEventSeq` and remembering its newest failure.
  RulesHost(const RendezvousState::Snapshot& snapshot, Micros now, uint64_t lastEventSeq = 0,
            std::optional<JobEvent> lastFailure = std::nullopt);

  // An admitted node joins. A node whose rules are not the job's is refused (kRulesMismatch,
  // naming the difference); so is whatever RendezvousState::join refuses. A refusal is a notice
  // for the node itself.
  Effects join(const Admitted& admitted, Micros now);
  // A message from a node that joined.
  Effects report(const std::string& nodeId, const AgentReport& report, Micros now);
  // The node is gone (its stream ended, its lease expired); saidSo: it said it leaves.
  Effects leave(const std::string& nodeId, const std::string& reason, Micros now, bool saidSo = false);
  Effects tick(Micros now);

  const RendezvousState& state() const { return state_; }
  const std::string& runId() const { return runId_; }
  // The job's newest failure event (a worker failure, a node lost, fenced or excluded, a failed
  // end), for the status call; nullopt while there was none.
  const std::optional<JobEvent>& lastFailure() const { return lastFailure_; }
  // The number of the job's newest event (0: none yet).
  uint64_t lastSeq() const { return nextSeq_ - 1; }

 private:
  // What the events of one call are derived from: the state before it, and what the call was.
  struct Before {
    RendezvousState::Phase phase;
    uint64_t round;
    int restartCount;
  };
  Before before() const { return {state_.phase(), state_.round(), state_.restartCount()}; }
  // Appends the events that `fx` and the change since `b` mean, numbered; `first` are the call's
  // own (a join, a failure, a leave), `cause` what an interruption of the round is put down to.
  void addEvents(const Before& b, std::vector<JobEvent> first, EventCause cause, Micros now, Effects* fx);
  Effects effectsOf(std::vector<Notice> notices) const;
  // The job-wide health view, to the members that report theirs.
  void tell(const std::optional<JobHealthTold>& told, Effects* fx) const;

  std::string runId_;
  RendezvousState state_;
  JobHealth health_;
  uint64_t nextSeq_ = 1;
  Micros gatheringSince_{0};  // when the gathering of the next round began (its formation time)
  std::optional<JobEvent> lastFailure_;
};

}  // namespace ddprun
