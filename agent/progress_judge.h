// --stop_without_progress (README): an attempt made progress when a rank beat a step beyond the
// best of every attempt before it (a job resumed from a checkpoint that fails at the same step
// again makes none). Each attempt is judged once, by the best step its ranks beat; only attempts
// that end in a restart count in the streak. Ranks that never beat are not judged.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ddprun {

class ProgressJudge {
 public:
  // limit: K of --stop_without_progress=K; 0: off.
  explicit ProgressJudge(int limit) : limit_(limit) {}

  // The attempt that ends: the best step it beat (nullopt: none), whether a restart follows
  // (a failure), and the attempt's restart count (the first attempt starts no streak).
  void judge(std::optional<int64_t> bestStep, bool endsInRestart, int restartCount);
  // After judge(): the job should stop instead of restarting again; the streak, and why, to say.
  int restartsWithoutProgress() const { return restartsWithoutProgress_; }
  bool stopNow() const { return limit_ > 0 && everBeat_ && restartsWithoutProgress_ >= limit_; }
  std::string why() const;

 private:
  const int limit_;
  std::optional<int64_t> highWater_;  // the best step of the attempts judged so far
  bool everBeat_ = false;
  int restartsWithoutProgress_ = 0;
};

}  // namespace ddprun
