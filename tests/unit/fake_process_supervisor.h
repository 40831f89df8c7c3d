// A ProcessSupervisor without processes, for tests of the agent's logic. It records what the agent
// asks for (spawns, signals, sweeps) and lets the test decide when and how each "process" ends.
//
// Pids are fake (1000, 1001, ...); nothing is ever started or signalled. The fds in a SpawnRequest
// belong to the caller: the fake closes none of them. With keepOutputFds it holds its own dups of
// the stdout/stderr write ends, as a live child would, so a test can write the worker's output;
// those dups are closed when the fake process ends.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "agent/process_supervisor.h"
#include "common/error.h"
#include "common/unique_fd.h"

namespace ddprun::test {

class FakeProcessSupervisor final : public ProcessSupervisor {
 public:
  struct Spawned {
    pid_t pid = 0;
    SpawnRequest request;
    bool outputFdsOpen = false;  // both fds were open descriptors when spawn was called
  };
  struct SignalSent {
    pid_t pid = 0;
    int sig = 0;
    bool operator==(const SignalSent& other) const { return pid == other.pid && sig == other.sig; }
  };

  explicit FakeProcessSupervisor(bool keepOutputFds = false) : keepOutputFds_(keepOutputFds) {}

  // ProcessSupervisor

  pid_t spawn(const SpawnRequest& request) override {
    ++spawnAttempts_;
    if (failingSpawns_.count(spawnAttempts_)) throw Error("fake spawn failure #" + std::to_string(spawnAttempts_));
    pid_t pid = nextPid_++;
    bool fdsOpen = ::fcntl(request.stdoutFd, F_GETFD) != -1 && ::fcntl(request.stderrFd, F_GETFD) != -1;
    spawned_.push_back(Spawned{pid, request, fdsOpen});
    running_.insert(pid);
    if (keepOutputFds_) {
      auto& fds = outputFds_[pid];
      if (request.stdoutFd >= 0) fds.first.reset(::dup(request.stdoutFd));
      if (request.stderrFd >= 0) fds.second.reset(::dup(request.stderrFd));
    }
    return pid;
  }

  void signalGroup(pid_t pid, int sig) override { signals_.push_back(SignalSent{pid, sig}); }
  void signalProcess(pid_t pid, int sig) override { processSignals_.push_back(SignalSent{pid, sig}); }

  void setExitHandler(ExitHandler handler) override { handler_ = std::move(handler); }

  int sweepOrphans(const std::vector<pid_t>& endedGroups) override {
    sweeps_.push_back(endedGroups);
    return 0;
  }

  // Test side

  // The n-th call to spawn (1-based, counting failed ones) throws Error.
  void failSpawnNumber(int n) { failingSpawns_.insert(n); }

  // Writes to the fake process's stdout or stderr (needs keepOutputFds).
  bool writeStdout(pid_t pid, std::string_view text) { return writeAll(outputFds_.at(pid).first.get(), text); }
  bool writeStderr(pid_t pid, std::string_view text) { return writeAll(outputFds_.at(pid).second.get(), text); }

  // Ends a fake process and tells the exit handler, as the real supervisor does on the event loop;
  // the test calls this from the thread that runs the io_context.
  void exitProcess(pid_t pid, int exitCode) { end(ProcessExit{pid, exitCode, 0}); }
  void killProcess(pid_t pid, int sig) { end(ProcessExit{pid, -1, sig}); }

  const std::vector<Spawned>& spawned() const { return spawned_; }
  const std::vector<SignalSent>& signals() const { return signals_; }
  const std::vector<SignalSent>& processSignals() const { return processSignals_; }
  const std::vector<std::vector<pid_t>>& sweeps() const { return sweeps_; }
  bool hasExitHandler() const { return static_cast<bool>(handler_); }
  bool isRunning(pid_t pid) const { return running_.count(pid) != 0; }
  std::vector<pid_t> runningPids() const { return {running_.begin(), running_.end()}; }

  // Signals sent to one pid, in order.
  std::vector<int> signalsTo(pid_t pid) const {
    std::vector<int> out;
    for (const auto& s : signals_) {
      if (s.pid == pid) out.push_back(s.sig);
    }
    return out;
  }

  // Pids of the last `count` spawns, oldest first.
  std::vector<pid_t> lastPids(size_t count) const {
    std::vector<pid_t> out;
    for (size_t i = spawned_.size() - std::min(count, spawned_.size()); i < spawned_.size(); ++i) {
      out.push_back(spawned_[i].pid);
    }
    return out;
  }

 private:
  void end(const ProcessExit& exit) {
    running_.erase(exit.pid);
    outputFds_.erase(exit.pid);  // a dead process holds no pipe
    if (handler_) handler_(exit);
  }

  bool keepOutputFds_;
  pid_t nextPid_ = 1000;
  int spawnAttempts_ = 0;
  std::set<int> failingSpawns_;
  std::vector<Spawned> spawned_;
  std::vector<SignalSent> signals_;
  std::vector<SignalSent> processSignals_;
  std::vector<std::vector<pid_t>> sweeps_;
  std::set<pid_t> running_;
  std::map<pid_t, std::pair<UniqueFd, UniqueFd>> outputFds_;
  ExitHandler handler_;
};

}  // namespace ddprun::test
