#include "agent/hang_calibration.h"

#include <fmt/format.h>

#include <algorithm>

namespace ddprun {
namespace {

std::string seconds(std::chrono::milliseconds d) {
  return fmt::format("{:.2f}s", static_cast<double>(d.count()) / 1000.0);
}

}  // namespace

std::string HangCalibration::key(const std::string& section) const {
  if (longest_.count(section) || longest_.size() < rules_.maxSections) return section;
  return "";  // a program that names sections without bound must not grow the agent's memory
}

std::chrono::milliseconds HangCalibration::bound(std::chrono::milliseconds longest) const {
  auto scaled = std::chrono::milliseconds(static_cast<int64_t>(static_cast<double>(longest.count()) * rules_.factor));
  return std::max(scaled, rules_.floor);
}

void HangCalibration::observe(int rank, const std::string& section, std::chrono::milliseconds interval) {
  const std::string k = key(section);
  int& seen = warm_[{rank, k}];
  if (seen < rules_.warmupIntervals) {
    ++seen;
    return;
  }
  auto& longest = longest_[k];
  longest = std::max(longest, interval);
}

void HangCalibration::adopt(const std::string& section, std::chrono::milliseconds longest) {
  const std::string k = key(section);
  auto& mine = longest_[k];
  mine = std::max(mine, longest);
}

std::chrono::milliseconds HangCalibration::timeoutFor(int rank, const std::string& section) const {
  const std::string k = key(section);
  auto warm = warm_.find({rank, k});
  auto learned = longest_.find(k);
  if (learned == longest_.end() || warm == warm_.end() || warm->second < rules_.warmupIntervals) {
    // Not learned yet, or this rank is still warming up in it: the initial bound, or the learned
    // one if that is longer.
    return learned == longest_.end() ? rules_.initial : std::max(rules_.initial, bound(learned->second));
  }
  return bound(learned->second);
}

std::vector<std::string> HangCalibration::takeChanges() {
  std::vector<std::string> lines;
  for (const auto& [section, longest] : longest_) {
    const auto now = bound(longest);
    auto it = logged_.find(section);
    if (it != logged_.end() && now.count() * 4 < it->second.count() * 5) continue;  // grew < 25%
    logged_[section] = now;
    const std::string factor = fmt::format("{:g}", rules_.factor);
    lines.push_back("--hang_timeout=auto: section '" + (section.empty() ? std::string("(none)") : section) +
                    "': longest interval " + seconds(longest) + " x " + factor + ", floor " + seconds(rules_.floor) +
                    ": a rank silent " + seconds(now) + " there is hung");
  }
  return lines;
}

}  // namespace ddprun
