// What the agent says of stragglers (README "Stragglers"): one warning and one event per change,
// for this node's ranks (StragglerDetector's changes) and across the job (the rendezvous'
// JobHealthView, told whenever it changed: only its differences are said).
#pragma once

#include <set>
#include <string>
#include <vector>

#include "agent/straggler_detector.h"
#include "rendezvous/rules/job_health.h"

namespace ddprun {

struct StragglerReport {
  int rank = 0;
  double seconds = 0;  // its median step time; 0 when back across the job
  bool back = false;   // it recovered
  std::string line;    // the warning
  std::string reason;  // the event's text
};

StragglerReport describeStraggler(const StragglerChange& change);

class JobStragglers {
 public:
  // The reports for what changed since the view told before.
  std::vector<StragglerReport> update(const JobHealthView& view);

 private:
  std::set<int> told_;  // the stragglers of the view told last
};

}  // namespace ddprun
