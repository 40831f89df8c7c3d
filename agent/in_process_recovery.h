// --recovery=in_process, the agent's bookkeeping (DESIGN.md section 11): which live ranks run under
// the API (their beats carry recoverable=1), whether a failure may be recovered in place, the
// failure being recovered, and the notice a live worker is told its next round with
// (docs/heartbeat.md, "Notices"). The agent (elastic_agent.cc) does the acting: it keeps the
// group, replaces the failed worker, tells the others.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "agent/worker_group.h"
#include "rendezvous/rules/node_view.h"

namespace ddprun {

class InProcessRecovery {
 public:
  explicit InProcessRecovery(bool enabled) : enabled_(enabled) {}

  bool enabled() const { return enabled_; }
  // A beat of local rank `localRank` said recoverable=1.
  void optedIn(int localRank) { optedIn_.insert(localRank); }
  // A new process runs at local rank `localRank` (a start or a replacement): it has not opted in yet.
  void forget(int localRank) { optedIn_.erase(localRank); }
  void reset() {
    optedIn_.clear();
    settlingPast_.reset();
  }
  // A recovery formed its round when the ranks here had beaten up to `step`: it is complete once
  // one of them beats a step past it. A failure before that is the recovery's own (a replacement
  // that does not come back, a re-initialization that times out in the API's bounded wait, a
  // sticky device error): no second recovery in place, every rank restarts.
  void recovered(int64_t step) { settlingPast_ = step; }
  void observedStep(int64_t step) {
    if (settlingPast_ && step > *settlingPast_) settlingPast_.reset();
  }

  // Whether the failure of `failed` may be recovered in place: enabled, and every other local rank
  // of 0..nproc-1 is running and opted in. `running(localRank)` tells which run; `why` says what
  // stands in the way otherwise.
  template <class Running>
  bool eligible(int failed, int nproc, Running running, std::string* why) const {
    if (!enabled_) return false;
    if (settlingPast_) {
      *why = "the last in-process recovery has not completed: no step past " + std::to_string(*settlingPast_) +
             " since";
      return false;
    }
    for (int lr = 0; lr < nproc; ++lr) {
      if (lr == failed) continue;
      if (!running(lr)) {
        *why = "local rank " + std::to_string(lr) + " is not running either";
        return false;
      }
      if (!optedIn_.count(lr)) {
        *why = "local rank " + std::to_string(lr) + " does not run under ddprun.recovery";
        return false;
      }
    }
    return true;
  }

  // The group is carried into the next round, from the failure (or a peer's interruption) to the
  // next round's start: `failed` is this node's failed worker, to be replaced; empty when the
  // failure was another node's (or a node was lost) and every local rank lives on. `reason` is what
  // the live ranks are told.
  struct Carry {
    std::optional<WorkerExit> failed;
    std::string reason;
  };
  std::optional<Carry> pending;

  // The notice that tells a live worker its next round: one line of key=value, `reason` last.
  // `env`: for a warm spare that becomes local rank `localRank`, the rest of its contract
  // (env.NAME=VALUE; values with a space are left out, the worker keeps its own).
  static std::string notice(const RoundInfo& round, int localRank, const std::string& reason,
                            const std::vector<std::pair<std::string, std::string>>& env = {});

 private:
  bool enabled_;
  std::set<int> optedIn_;
  std::optional<int64_t> settlingPast_;
};

}  // namespace ddprun
