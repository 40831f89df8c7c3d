// The agent's half of ddprun-watchdog (see watchdog_main.cc): starts it, keeps the pipe's write end,
// and tells it which worker process groups exist. If the agent dies, the pipe closes and the
// watchdog cleans up. Missing watchdog = a warning, not a failure: only kill -9 is less covered.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <mutex>
#include <string>

#include "common/unique_fd.h"

namespace ddprun {

class Lifeline {
 public:
  // Starts `watchdogPath --marker MARKER [--remove FOLDER] [--cgroup PATH]`. On failure logs a
  // warning and stays inactive.
  Lifeline(const std::string& watchdogPath, const std::string& marker, const std::string& temporaryFolder = "",
           const std::string& cgroup = "");
  // Closes the pipe; unless released, waits briefly for the watchdog's final sweep, so that
  // "ddprun exited" means "nothing of the job is left".
  ~Lifeline();

  bool active() const { return static_cast<bool>(pipe_); }
  // The agent has cleaned up everything itself: tells the watchdog to exit without its sweep, and
  // closes the lifeline without waiting.
  void release();
  pid_t watchdogPid() const { return pid_; }
  void trackGroup(pid_t pgid);
  void forgetGroup(pid_t pgid);
  // Fencing: the watchdog kills every tracked group (and the job's cgroup, and marked processes)
  // at `deadline` unless a later one arrives first. Any thread.
  void fenceAt(std::chrono::steady_clock::time_point deadline);

 private:
  void send(const std::string& line);

  std::mutex mu_;  // fenceAt comes from the rendezvous thread, the rest from the event loop
  UniqueFd pipe_;
  pid_t pid_ = -1;
};

}  // namespace ddprun
