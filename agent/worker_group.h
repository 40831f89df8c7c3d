// The workers of one attempt on this node: starts them, maps their exits to ranks, reports the
// first failure or the success of all, and stops them (signal, grace period, SIGKILL).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "agent/process_supervisor.h"
#include "agent/worker_output.h"

namespace boost::asio {
class io_context;
}

namespace ddprun {

struct WorkerSpec {
  int localRank = 0;
  int rank = 0;
  SpawnRequest request;        // fds are filled in by the group
  WorkerOutputOptions output;
  std::string errorFile;       // TORCHELASTIC_ERROR_FILE of this worker
  std::string flightRecorder;  // DDPRUN_FLIGHT_RECORDER: libddp's record of its collectives
};

// How one worker ended. Spawn failures are exits too (exitCode 127, spawnError set).
struct WorkerExit {
  int localRank = 0;
  int rank = 0;
  pid_t pid = 0;
  int exitCode = -1;   // -1 when killed by a signal
  int signal = 0;
  std::chrono::system_clock::time_point time;
  std::string spawnError;
  std::string hangNote;  // set when the agent declared the worker hung (no heartbeat)

  bool succeeded() const { return exitCode == 0 && signal == 0; }
};

struct WorkerGroupEvents {
  std::function<void(const WorkerExit&)> onSucceededWorker;  // each worker that exited 0, as it does
  std::function<void(const WorkerExit&)> onFirstFailure;  // once, unless the group is stopping
  std::function<void()> onSucceeded;                      // every worker exited 0
  std::function<void()> onStopped;                        // after stop(): every worker has exited
};

class WorkerGroup {
 public:
  WorkerGroup(boost::asio::io_context& io, ProcessSupervisor& supervisor, std::vector<WorkerSpec> workers,
              WorkerGroupEvents events);
  ~WorkerGroup();

  void start();
  // Starts the workers, the first ones by taking `waiting`'s warm spares (started while this node
  // waited for a round) instead of new processes; the spares left over become this group's.
  // Returns, by local rank, the pid of the spare each worker took (0: a new process was started).
  // The caller tells each such spare that it is that rank now.
  std::vector<pid_t> startWithSpares(WorkerGroup& waiting);
  // In-process recovery: starts a worker that exited again from `spec` (a new process, the new
  // round's environment) while the others keep running; its next failure is reported as a new
  // first failure. False when that worker still runs or the group is stopping.
  bool replace(int localRank, WorkerSpec spec);
  // Warm spares (--spares_per_node): processes that ran the script up to ddprun.recovery's entry
  // and wait there, not ranks. One that ends on its own is logged and forgotten; stop() and
  // killNow() end them too (SIGKILL: nothing of theirs to save), and onStopped waits for them.
  // addSpare starts one (its pid; 0 when it could not be started, logged).
  pid_t addSpare(WorkerSpec spec);
  // The oldest spare takes the place of `localRank`, which exited: it becomes that worker (its
  // exits, its output, now with `spec`'s prefix), and its next failure is a new first failure.
  // Returns its pid; 0 when no spare runs (or that worker still does).
  pid_t promoteSpare(int localRank, WorkerSpec spec);
  // In-process recovery across nodes: the live workers carried into a round that places this
  // node's ranks at `rankOffset` (a lost node can move them); their exits say their new ranks.
  void renumber(int rankOffset);
  void killSpares();
  std::size_t spares() const;
  // Routes one exit from the supervisor; false when the pid is not one of this group's workers.
  bool handleExit(const ProcessExit& exit);
  // Sends sig to every running worker's process group, then SIGKILL after grace. Calling it again
  // only shortens the grace period.
  void stop(int sig, std::chrono::milliseconds grace);
  void killNow();
  // The agent declared the attempt failed itself (a hang): exits from now on are not failures,
  // and the group does not succeed.
  void markFailed();
  // Sends sig to the main process of a running worker (not its group); false if it has exited.
  bool signalWorker(int localRank, int sig);
  bool running(int localRank) const;
  pid_t pid(int localRank) const;  // 0 if it never started
  // Reads what the worker's pipes hold right now into its output (its stack dump, say).
  void drainOutput(int localRank);

  bool allExited() const;
  const std::vector<WorkerExit>& exits() const;   // in the order they happened
  std::vector<std::string> stderrTail(int localRank) const;
  const WorkerSpec& spec(int localRank) const;
  std::vector<pid_t> pids() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun
