#include "rendezvous/rules/job_health.h"

#include <algorithm>

#include "common/median.h"

namespace ddprun {

std::optional<JobHealthTold> JobHealth::update(const std::string& node, NodeHealth health,
                                               std::chrono::microseconds now) {
  // Bounded whatever the agent sent: the first ranks and sections only, sane values only.
  NodeHealth kept;
  for (const auto& [rank, s] : health.stepSeconds) {
    if (kept.stepSeconds.size() == rules_.maxRanksPerNode) break;
    if (rank >= 0 && s >= 0 && s <= 86400) kept.stepSeconds[rank] = s;
  }
  for (const auto& [section, longest] : health.sections) {
    if (kept.sections.size() == rules_.maxSections) break;
    if (section.size() <= 64 && longest.count() >= 0) kept.sections[section] = longest;
  }
  auto [slot, added] = nodes_.try_emplace(node);
  if (added) dirty_ = true;  // a new reporter: at least told the standing view
  if (slot->second == kept) return tick(now);
  slot->second = std::move(kept);
  dirty_ = true;
  return tick(now);
}

std::optional<JobHealthTold> JobHealth::tick(std::chrono::microseconds now) {
  if (!dirty_ || now - lastRecompute_ < rules_.recomputeEvery) return std::nullopt;
  return recompute(now);
}

void JobHealth::forget(const std::string& node) {
  if (nodes_.erase(node)) dirty_ = true;
  toldNodes_.erase(node);
}

std::vector<std::string> JobHealth::reporters() const {
  std::vector<std::string> out;
  for (const auto& [node, h] : nodes_) out.push_back(node);
  return out;
}

std::optional<JobHealthTold> JobHealth::recompute(std::chrono::microseconds now) {
  dirty_ = false;
  lastRecompute_ = now;
  JobHealthView view;
  std::vector<double> all;
  for (const auto& [node, h] : nodes_) {
    for (const auto& [rank, s] : h.stepSeconds) all.push_back(s);
    for (const auto& [section, longest] : h.sections) {
      if (view.sections.size() >= rules_.maxSections && !view.sections.count(section)) continue;
      auto& v = view.sections[section];
      v = std::max(v, longest);
    }
  }
  view.ranks = static_cast<int>(all.size());
  if (all.size() >= 2) {
    view.medianSeconds = median(all);
    for (const auto& [node, h] : nodes_) {
      for (const auto& [rank, s] : h.stepSeconds) {
        if (s > rules_.factor * view.medianSeconds && s - view.medianSeconds >= rules_.minExcess) {
          view.stragglers.push_back(StragglerInfo{rank, s, node});
        }
      }
    }
  }
  // Told when the set of stragglers changes or a section's bound grows (or appears).
  auto ranksOf = [](const std::vector<StragglerInfo>& v) {
    std::set<int> r;
    for (const auto& s : v) r.insert(s.rank);
    return r;
  };
  bool grew = false;
  for (const auto& [section, longest] : view.sections) {
    auto it = toldSections_.find(section);
    if (it == toldSections_.end() || longest > it->second) grew = true;
  }
  JobHealthTold out;
  if (grew || ranksOf(view.stragglers) != ranksOf(told_)) {
    told_ = view.stragglers;
    toldSections_ = view.sections;
    toldNodes_.clear();
    out.nodes = reporters();
  } else if (!told_.empty() || !toldSections_.empty()) {
    // Unchanged, but a member that reports since the last telling has not heard it.
    for (const auto& [node, h] : nodes_) {
      if (!toldNodes_.count(node)) out.nodes.push_back(node);
    }
  }
  if (out.nodes.empty()) return std::nullopt;
  toldNodes_.insert(out.nodes.begin(), out.nodes.end());
  out.view = std::move(view);
  return out;
}

}  // namespace ddprun
