#include "agent/hang_detector.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace ddprun {

HangDetector::HangDetector(std::chrono::milliseconds timeout) : timeout_(timeout) {}

HangDetector::HangDetector(HangCalibrationRules rules)
    : timeout_(std::min(rules.floor, std::chrono::milliseconds(1000))) {  // the check period's base
  calibration_.emplace(rules);
}

std::chrono::milliseconds HangDetector::checkPeriod() const {
  if (timeout_.count() <= 0) return std::chrono::milliseconds(0);
  return std::max(timeout_ / 4, std::chrono::milliseconds(10));
}

void HangDetector::arm() {
  beats_.clear();
  finished_.clear();
  bestStep_.reset();
  reported_ = false;
  if (calibration_) calibration_->newAttempt();
  armed_ = true;
}

void HangDetector::disarm() { armed_ = false; }

void HangDetector::forget(int rank) {
  beats_.erase(rank);
  finished_.insert(rank);
}

bool HangDetector::observe(const HeartbeatMessage& message, Clock::time_point now) {
  if (!armed_) return false;
  bestStep_ = std::max(bestStep_.value_or(message.step), message.step);
  if (finished_.count(message.rank)) return false;
  auto& beat = beats_[message.rank];
  if (calibration_ && beat.at != Clock::time_point{}) {
    // The silence before this beat was spent in the section the previous beat named.
    calibration_->observe(message.rank, beat.section, std::chrono::duration_cast<std::chrono::milliseconds>(now - beat.at));
    for (const auto& line : calibration_->takeChanges()) spdlog::warn("{}", line);
  }
  beat = Beat{now, message.step, message.section};
  return true;
}

std::optional<HungRank> HangDetector::check(Clock::time_point now) {
  if (!armed_ || reported_ || timeout_.count() <= 0) return std::nullopt;
  for (const auto& [rank, beat] : beats_) {
    auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - beat.at);
    const auto bound = calibration_ ? calibration_->timeoutFor(rank, beat.section) : timeout_;
    if (silent >= bound) {
      reported_ = true;  // one report per attempt
      return HungRank{rank, beat.step, silent, beat.section, bound, calibration_.has_value()};
    }
  }
  return std::nullopt;
}

std::optional<std::chrono::milliseconds> HangDetector::silentFor(int rank, Clock::time_point now) const {
  auto it = beats_.find(rank);
  if (it == beats_.end()) return std::nullopt;
  return std::chrono::duration_cast<std::chrono::milliseconds>(now - it->second.at);
}

std::map<std::string, std::chrono::milliseconds> HangDetector::learnedSections() const {
  return calibration_ ? calibration_->learned() : std::map<std::string, std::chrono::milliseconds>{};
}

void HangDetector::adoptSections(const std::map<std::string, std::chrono::milliseconds>& sections) {
  if (!calibration_) return;
  for (const auto& [section, longest] : sections) calibration_->adopt(section, longest);
  for (const auto& line : calibration_->takeChanges()) spdlog::warn("{} (job-wide)", line);
}

}  // namespace ddprun
