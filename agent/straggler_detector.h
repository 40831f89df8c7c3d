// Stragglers: ranks whose own work per step (the compute time a heartbeat carries, "time=SECONDS":
// measured by libddp's GradientReducer, or given to ddprun.report_step(step, seconds)) is well
// above the other ranks'. Each rank's median over its last `window` steps is compared with the
// median of those medians; a rank above `factor` times it (and by at least `minExcess`, so that
// microsecond steps do not flap) is a straggler, reported once until it recovers. Medians, not
// means: one slow step (a checkpoint, a GC pause) does not make a straggler. Pure logic, no clock
// of its own; the group is judged at most every `evaluateEvery`, so the cost per beat is a push.
#pragma once

#include <chrono>
#include <cstddef>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <vector>

namespace ddprun {

struct StragglerRules {
  std::size_t window = 20;
  std::size_t minSamples = 5;  // per rank, before it is judged or counted in the median
  double factor = 1.5;
  double minExcess = 0.005;    // seconds
  std::chrono::milliseconds evaluateEvery{200};
};

struct StragglerChange {
  int rank = 0;
  bool straggling = true;  // false: it recovered
  double seconds = 0;      // its median step time
  double median = 0;       // the group's
  int ranks = 0;           // ranks compared
};

class StragglerDetector {
 public:
  explicit StragglerDetector(StragglerRules rules = {}) : rules_(rules) {}
  void newAttempt();
  // A rank's step took `seconds` of its own work; returns what changed, if the group was judged.
  std::vector<StragglerChange> observe(int rank, double seconds, std::chrono::steady_clock::time_point now);
  const std::set<int>& stragglers() const { return flagged_; }
  // Each rank's median with enough samples: this node's part of the job-wide view.
  std::map<int, double> medians() const;

 private:
  std::vector<StragglerChange> evaluate();

  StragglerRules rules_;
  std::map<int, std::deque<double>> samples_;
  std::set<int> flagged_;
  std::chrono::steady_clock::time_point lastEvaluation_{};
};

}  // namespace ddprun
