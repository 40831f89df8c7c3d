// Hang evidence from heartbeats (docs/heartbeat.md): the beats of the current attempt, as a
// HeartbeatSource delivers them, and a clock the caller reads. A rank that has beaten once and
// then stays silent for the timeout is hung (with its last step and section), so a stuck
// collective is found without waiting out its own timeout. Ranks that never beat (programs without
// the SDK or the package) are never reported. With a timeout of 0 it only keeps the beats: the
// agent asks it whether a rank is alive (--finish_timeout) and how far the attempt got
// (--stop_without_progress). No I/O and no timer of its own: the agent calls check() every
// checkPeriod().
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "agent/hang_calibration.h"
#include "common/heartbeat_message.h"

namespace ddprun {

struct HungRank {
  int rank = 0;
  int64_t lastStep = 0;
  std::chrono::milliseconds silentFor{0};
  std::string section;  // the section its last beat named, or empty
  std::chrono::milliseconds bound{0};  // the silence that made it hung
  bool calibrated = false;             // the bound was learned (--hang_timeout=auto)
};

class HangDetector {
 public:
  using Clock = std::chrono::steady_clock;

  // timeout 0: never reports a rank hung.
  explicit HangDetector(std::chrono::milliseconds timeout);
  // --hang_timeout=auto: the bound is learned from the beats (agent/hang_calibration.h).
  explicit HangDetector(HangCalibrationRules rules);

  // How often check() should run; 0: never (listening only).
  std::chrono::milliseconds checkPeriod() const;
  // A new attempt starts: forget every rank.
  void arm();
  // Stop reporting (the group is stopping); arm() starts again.
  void disarm();
  // The rank exited (0): it beats no more and is no longer watched in this attempt.
  void forget(int rank);
  // A beat at `now`. True when it comes from a live rank of the armed attempt (its step time
  // then counts for stragglers).
  bool observe(const HeartbeatMessage& beat, Clock::time_point now);
  // The first rank of the armed attempt silent past its bound, once per attempt.
  std::optional<HungRank> check(Clock::time_point now);
  // How long since the rank's last beat in this attempt; nullopt if it has not beaten.
  std::optional<std::chrono::milliseconds> silentFor(int rank, Clock::time_point now) const;
  // The highest step any rank beat in this attempt (finished ranks included); nullopt: no beat.
  std::optional<int64_t> bestStep() const { return bestStep_; }
  // --hang_timeout=auto: what this node learned per section, and bounds learned elsewhere in the
  // job (the longer wins). Empty / ignored with a fixed timeout.
  std::map<std::string, std::chrono::milliseconds> learnedSections() const;
  void adoptSections(const std::map<std::string, std::chrono::milliseconds>& sections);

 private:
  struct Beat {
    Clock::time_point at;
    int64_t step = 0;
    std::string section;
  };

  std::chrono::milliseconds timeout_;
  std::map<int, Beat> beats_;
  std::set<int> finished_;  // ranks that exited in this attempt
  std::optional<int64_t> bestStep_;
  std::optional<HangCalibration> calibration_;
  bool armed_ = false;     // beats of the current attempt are taken
  bool reported_ = false;  // a rank of this attempt was reported hung
};

}  // namespace ddprun
