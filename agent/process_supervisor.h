// The agent's only door to processes: start one, signal its process group, hear that it ended,
// and sweep up whatever its descendants left behind. PosixProcessSupervisor is the real one; tests
// of agent logic use FakeProcessSupervisor (tests/unit).
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "common/environment.h"

namespace ddprun {

struct SpawnRequest {
  std::string executable;          // absolute path, already checked
  std::vector<std::string> args;   // argv[1..]
  Environment env;                 // the whole environment of the child
  int stdoutFd = -1;               // becomes the child's fd 1; -1 inherits the agent's
  int stderrFd = -1;               // becomes the child's fd 2; -1 inherits the agent's
  std::vector<int> cpus;           // CPU affinity of the child (--numa_binding); empty inherits
  // An fd of the agent that the child keeps open, at the same number (the worker's end of its
  // heartbeat channel, docs/heartbeat.md); -1: none. Every other fd above 2 is closed on exec.
  int inheritFd = -1;
};

// How a process ended: exitCode when it exited, signal when a signal killed it.
struct ProcessExit {
  pid_t pid = 0;
  int exitCode = -1;  // -1 when killed by a signal
  int signal = 0;     // 0 when it exited
};

class ProcessSupervisor {
 public:
  using ExitHandler = std::function<void(const ProcessExit&)>;

  virtual ~ProcessSupervisor() = default;
  // Starts a process in a process group of its own. Throws Error when it cannot be started.
  virtual pid_t spawn(const SpawnRequest& request) = 0;
  // Sends sig to the process group led by pid (the whole worker, grandchildren included).
  virtual void signalGroup(pid_t pid, int sig) = 0;
  // Sends sig to the running process pid alone (SIGABRT for a stack dump: not its children).
  virtual void signalProcess(pid_t pid, int sig) = 0;
  // Called on the event loop, once for every spawned process that ends.
  virtual void setExitHandler(ExitHandler handler) = 0;
  // Kills every process that the spawned processes left behind once they ended (grandchildren,
  // daemons that left their group) and forgets the given groups. Returns how many it killed.
  virtual int sweepOrphans(const std::vector<pid_t>& endedGroups) = 0;
};

}  // namespace ddprun
