#include "agent/straggler_detector.h"

#include <algorithm>

#include "common/median.h"

namespace ddprun {

void StragglerDetector::newAttempt() {
  samples_.clear();
  flagged_.clear();
}

std::vector<StragglerChange> StragglerDetector::observe(int rank, double seconds,
                                                        std::chrono::steady_clock::time_point now) {
  if (!(seconds >= 0) || seconds > 86400) return {};
  auto& s = samples_[rank];
  s.push_back(seconds);
  if (s.size() > rules_.window) s.pop_front();
  if (now - lastEvaluation_ < rules_.evaluateEvery) return {};
  lastEvaluation_ = now;
  return evaluate();
}

std::map<int, double> StragglerDetector::medians() const {
  std::map<int, double> out;
  for (const auto& [rank, s] : samples_) {
    if (s.size() >= rules_.minSamples) out[rank] = median({s.begin(), s.end()});
  }
  return out;
}

std::vector<StragglerChange> StragglerDetector::evaluate() {
  const std::map<int, double> medians = this->medians();
  std::vector<StragglerChange> changes;
  if (medians.size() < 2) return changes;
  std::vector<double> all;
  for (const auto& [rank, m] : medians) all.push_back(m);
  const double group = median(all);
  for (const auto& [rank, m] : medians) {
    const bool slow = m > rules_.factor * group && m - group >= rules_.minExcess;
    if (slow == static_cast<bool>(flagged_.count(rank))) continue;
    if (slow) {
      flagged_.insert(rank);
    } else {
      flagged_.erase(rank);
    }
    changes.push_back(StragglerChange{rank, slow, m, group, static_cast<int>(medians.size())});
  }
  return changes;
}

}  // namespace ddprun
