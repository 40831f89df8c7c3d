// The job-wide view of the ranks' health, kept by the one rules host from what each member's agent
// reports with its heartbeats (agent/straggler_detector.h, agent/hang_calibration.h):
// - stragglers across every node: ranks whose median compute time per step is above `factor`
//   times the median over all the job's ranks (and by `minExcess`), named with their node;
// - the longest heartbeat interval per section on any node, so that every node's
//   --hang_timeout=auto uses the same bounds.
// What changed is told to the members that report health, and a member that starts reporting
// later (a slow start, a rejoin) is told the standing view once. Bounded: ranks and sections per node
// are capped, and the view is recomputed at most every `recomputeEvery` however many nodes report.
// No I/O, no clock of its own.
#pragma once

#include <chrono>
#include <cstddef>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace ddprun {

struct NodeHealth {
  std::map<int, double> stepSeconds;                           // rank -> median compute time per step
  std::map<std::string, std::chrono::milliseconds> sections;  // section -> longest interval
  bool operator==(const NodeHealth&) const = default;
};

struct StragglerInfo {
  int rank = 0;
  double seconds = 0;
  std::string node;
  bool operator==(const StragglerInfo&) const = default;
};

struct JobHealthView {
  std::vector<StragglerInfo> stragglers;
  double medianSeconds = 0;
  int ranks = 0;
  std::map<std::string, std::chrono::milliseconds> sections;
};

// A view and the nodes to tell it to.
struct JobHealthTold {
  JobHealthView view;
  std::vector<std::string> nodes;
};

struct JobHealthRules {
  double factor = 1.5;
  double minExcess = 0.005;
  std::size_t maxRanksPerNode = 1024;
  std::size_t maxSections = 32;
  std::chrono::microseconds recomputeEvery{std::chrono::seconds(1)};
};

class JobHealth {
 public:
  explicit JobHealth(JobHealthRules rules = {}) : rules_(rules) {}
  // A member's report; what to tell whom: every reporting member if the view changed, only the
  // members not told yet if it did not (nullopt: nothing to tell, or not recomputed yet: a later
  // report or tick() does).
  std::optional<JobHealthTold> update(const std::string& node, NodeHealth health, std::chrono::microseconds now);
  std::optional<JobHealthTold> tick(std::chrono::microseconds now);
  void forget(const std::string& node);
  // The nodes that report health (and get the view).
  std::vector<std::string> reporters() const;

 private:
  std::optional<JobHealthTold> recompute(std::chrono::microseconds now);

  JobHealthRules rules_;
  std::map<std::string, NodeHealth> nodes_;
  bool dirty_ = false;
  std::chrono::microseconds lastRecompute_{-std::chrono::hours(1)};
  std::vector<StragglerInfo> told_;                               // the stragglers last told
  std::map<std::string, std::chrono::milliseconds> toldSections_;  // the bounds last told
  std::set<std::string> toldNodes_;                               // the nodes that have them
};

}  // namespace ddprun
