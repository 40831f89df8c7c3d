// --finish_timeout (README "When a job hangs"): once a rank of the job exited 0 (here, or on
// another node as the rendezvous tells), every other rank must exit within the bound; a rank still
// running past it that has not beaten within it is hung. One object per attempt; the agent owns
// the timer and asks check() when the bound (or a rank's next chance to reach it) has passed.
#pragma once

#include <chrono>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace ddprun {

class FinishTimeout {
 public:
  using Clock = std::chrono::steady_clock;

  // bound 0: off.
  explicit FinishTimeout(std::chrono::milliseconds bound) : bound_(bound) {}

  std::chrono::milliseconds bound() const { return bound_; }
  // A local rank exited 0. True the first time in the attempt (the rendezvous is told once).
  bool rankFinished(int rank);
  // A rank of another node finished (the first one told is named).
  void peerFinished(int rank, const std::string& node);
  // Starts the bound at `now`, once per attempt; true when it started now (the agent then checks
  // after bound()). Never when off.
  bool start(Clock::time_point now);

  // A rank still running here, as the agent sees it at check time.
  struct Running {
    int localRank = 0;
    int rank = 0;
    std::optional<std::chrono::milliseconds> silentFor;  // since its last beat; nullopt: never beat
  };
  struct Verdict {
    std::vector<int> hung;  // local ranks; empty: none yet
    std::chrono::milliseconds nextCheck{0};  // when none is hung: look again after this
    std::string diagnosis;  // when some are: the failure report's explanation
    std::string hangNote;   // and the note on the rank blamed (the first of them)
  };
  // The bound has passed since start(): every running rank that has not beaten within it is hung;
  // one that beat is alive (an epilogue that says so) and looked at again when its silence could
  // reach the bound.
  Verdict check(const std::vector<Running>& running, Clock::time_point now) const;

 private:
  struct Peer {
    int rank = 0;
    std::string node;
  };
  std::chrono::milliseconds bound_;
  bool started_ = false;
  Clock::time_point startedAt_;
  std::set<int> finishedRanks_;  // ranks here that exited 0
  bool reported_ = false;
  std::optional<Peer> peer_;
};

// "12.3s", as the agent's messages write durations.
std::string formatSeconds(std::chrono::milliseconds d);

}  // namespace ddprun
