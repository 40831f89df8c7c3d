// --hang_timeout=auto: the bound on a rank's silence, learned from the intervals between its
// heartbeats, per section (the named phase its last beat was in: a checkpoint is slower than a
// step). The rule, as NVIDIA's ft_launcher calibrates: the longest interval seen in the section,
// times a safety factor, never below a floor; the first intervals of every rank in every attempt
// are warm-up (compilation, caches, the first checkpoint read) and neither teach nor are judged by
// the learned value; until a section has a learned value, the initial bound holds. What is learned
// is kept across the job's restarts (the agent outlives its attempts). Pure logic: no clock.
#pragma once

#include <chrono>
#include <cstddef>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ddprun {

struct HangCalibrationRules {
  std::chrono::milliseconds initial{std::chrono::minutes(10)};  // before a section is learned
  double factor = 5.0;
  std::chrono::milliseconds floor{std::chrono::seconds(3)};
  int warmupIntervals = 3;      // per rank, section and attempt
  std::size_t maxSections = 32;  // sections beyond this share the bound of the unnamed one
};

class HangCalibration {
 public:
  explicit HangCalibration(HangCalibrationRules rules) : rules_(rules) {}

  // A new attempt: warm-up again; what was learned stays.
  void newAttempt() { warm_.clear(); }
  // A rank beat after `interval` of silence spent in `section` (its previous beat's section).
  void observe(int rank, const std::string& section, std::chrono::milliseconds interval);
  // The bound on a rank's silence in `section` now.
  std::chrono::milliseconds timeoutFor(int rank, const std::string& section) const;
  // Log lines for the learned bounds that changed since the last call ("section 'train': longest
  // interval 0.21s x 5 = 1.1s, floor 3.0s: 3.0s"); a bound is logged again when it grows by 25%.
  std::vector<std::string> takeChanges();
  // The longest interval learned per section, and bounds learned on other nodes (the job-wide
  // view): a section's value becomes the longer of the two.
  const std::map<std::string, std::chrono::milliseconds>& learned() const { return longest_; }
  void adopt(const std::string& section, std::chrono::milliseconds longest);

 private:
  std::string key(const std::string& section) const;
  std::chrono::milliseconds bound(std::chrono::milliseconds longest) const;

  HangCalibrationRules rules_;
  std::map<std::string, std::chrono::milliseconds> longest_;  // learned, per section
  std::map<std::string, std::chrono::milliseconds> logged_;   // the bound last logged
  std::map<std::pair<int, std::string>, int> warm_;           // intervals seen this attempt
};

}  // namespace ddprun
