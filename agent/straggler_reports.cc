#include "agent/straggler_reports.h"

#include <fmt/format.h>


namespace ddprun {

StragglerReport describeStraggler(const StragglerChange& c) {
  const std::string text =
      c.straggling ? fmt::format("straggler: rank {} takes {:.4f}s of its own work per step (median of its last steps), "
                                 "{:.1f}x the median {:.4f}s of the {} ranks on this node",
                                 c.rank, c.seconds, c.median > 0 ? c.seconds / c.median : 0.0, c.median, c.ranks)
                   : fmt::format("straggler: rank {} is back to {:.3f}s per step (median {:.3f}s)", c.rank, c.seconds,
                                 c.median);
  return StragglerReport{c.rank, c.seconds, !c.straggling, text, text};
}

std::vector<StragglerReport> JobStragglers::update(const JobHealthView& view) {
  std::vector<StragglerReport> reports;
  std::set<int> now;
  for (const auto& s : view.stragglers) {
    now.insert(s.rank);
    if (told_.count(s.rank)) continue;
    const std::string text =
        fmt::format("takes {:.4f}s of its own work per step, {:.1f}x the job's median {:.4f}s of {} ranks", s.seconds,
                    view.medianSeconds > 0 ? s.seconds / view.medianSeconds : 0.0, view.medianSeconds, view.ranks);
    reports.push_back(StragglerReport{s.rank, s.seconds, false,
                                      "straggler across the job: rank " + std::to_string(s.rank) + " on node " + s.node +
                                          " " + text,
                                      "across the job, on node " + s.node + ": " + text});
  }
  for (int rank : told_) {
    if (now.count(rank)) continue;
    reports.push_back(StragglerReport{rank, 0, true,
                                      "straggler across the job: rank " + std::to_string(rank) +
                                          " is back near the job's median",
                                      "across the job: back near the job's median"});
  }
  told_ = std::move(now);
  return reports;
}

}  // namespace ddprun
