// The real ProcessSupervisor: spawns with agent/worker_spawn.h (clone3 into the job's cgroup, or
// vfork; either way the cost does not grow with the agent's memory), reaps every child through
// SIGCHLD on the event loop, and makes sure nothing outlives the agent: each worker leads its own
// process group and dies with the agent's thread (PR_SET_PDEATHSIG), the agent is a child
// subreaper so orphaned grandchildren come back to it, every descendant carries a marker
// variable, and ddprun-watchdog covers kill -9 of the agent.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "agent/process_supervisor.h"
#include "agent/worker_spawn.h"

namespace boost::asio {
class io_context;
}

namespace ddprun {

struct PosixProcessSupervisorOptions {
  // Path of ddprun-watchdog; empty disables it (unit and integration tests of the class itself).
  std::string watchdogPath;
  // A temporary folder of the run that the watchdog removes if the agent dies without cleaning up
  // (kill -9); empty: none.
  std::string temporaryFolder;
  // How workers start; kVfork only where a test must cover the fallback.
  SpawnMethod spawnMethod = SpawnMethod::kAuto;
};

class PosixProcessSupervisor final : public ProcessSupervisor {
 public:
  PosixProcessSupervisor(boost::asio::io_context& io, PosixProcessSupervisorOptions options);
  // Kills whatever is still running: a supervisor never leaves processes behind.
  ~PosixProcessSupervisor() override;

  pid_t spawn(const SpawnRequest& request) override;
  void signalGroup(pid_t pid, int sig) override;
  void signalProcess(pid_t pid, int sig) override;
  void setExitHandler(ExitHandler handler) override;
  int sweepOrphans(const std::vector<pid_t>& endedGroups) override;

  // Fencing (docs/rendezvous.md): the watchdog kills every worker at `deadline` unless a later
  // deadline arrives first, even if this process is frozen then. Any thread.
  void setFenceDeadline(std::chrono::steady_clock::time_point deadline);

  // The environment variable every descendant carries (its name is unique to this agent).
  const std::string& marker() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// The watchdog next to the running executable (/proc/self/exe's folder), as installed and built.
std::string defaultWatchdogPath();

}  // namespace ddprun
