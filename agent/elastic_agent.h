// The agent's control loop for one node: rendezvous -> start the worker group -> watch it -> on a
// failure or an interrupted round, stop it and go to the next round -> on success, exit barrier.
// It decides, it does not touch processes or sockets itself: processes go through the
// ProcessSupervisor, membership and the restart budget through the Rendezvous.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "agent/agent_events.h"
#include "agent/console_writer.h"
#include "agent/heartbeat_source.h"
#include "agent/log_options.h"
#include "agent/process_supervisor.h"
#include "rendezvous/client/rendezvous.h"

namespace boost::asio {
class io_context;
}

namespace ddprun {

class TorchStore;

struct AgentOptions {
  std::string programName;          // as the user typed it, for messages
  std::string executable;           // absolute path
  std::vector<std::string> args;    // argv[1..]
  // torch.distributed.launch's argument: when set ("--local_rank" or "--local-rank"), each worker
  // gets "<flag>=<local rank>" inserted into args at localRankArgAt (right after the script).
  std::string localRankArg;
  std::size_t localRankArgAt = 0;
  Environment inherited;            // the agent's environment, passed on to workers
  int nprocPerNode = 1;
  std::string role = "default";
  int maxRestarts = 0;
  std::string runId = "none";
  std::string host;
  bool virtualLocalRank = false;
  std::chrono::milliseconds shutdownGrace{30000};
  // A rank whose SDK heartbeat stops this long is hung: the group is stopped and restarted within
  // the budget. 0 = off.
  std::chrono::milliseconds hangTimeout{0};
  // --hang_timeout=auto: the bound is learned per section (agent/hang_calibration.h); hangTimeout
  // is then unused.
  bool hangTimeoutAuto = false;
  // Once a rank of the job exited 0 (here, or on another node as the rendezvous tells), every
  // other rank must exit within this; a rank still running past it that has not beaten within it
  // is hung (README "When a job hangs"). 0 = off.
  std::chrono::milliseconds finishTimeout{0};
  // --stop_without_progress: after this many restarts in a row in which no local rank beat a step
  // beyond the best of the attempts before, this node's next failure ends the job (0 = off).
  // Ranks that never beat are not judged.
  int stopWithoutProgress = 0;
  // How long a hang's stack dumps are awaited before the ranks are stopped anyway.
  std::chrono::milliseconds stackDumpWait{3000};
  // Whether a worker's process can dump its stack on SIGABRT (a Python interpreter); tests replace it.
  std::function<bool(pid_t)> canDumpStack;
  LogOptions log;
  // Folder for per-attempt, per-rank files: error.json always, stdout.log/stderr.log when logs are
  // kept (LogOptions::logDir set, or redirects/tee ask for files).
  std::string runDir;
  // runDir is the agent's own temporary folder (no logs in it, removed at exit): a rank's files lie
  // flat in it instead of in attempt_N/<local rank>/ folders.
  bool flatRunDir = false;
  bool writeLogFiles = false;
  // ddprun's stdout and stderr (worker lines, the failure report); null: the agent makes writers
  // on fds 1 and 2.
  std::shared_ptr<ConsoleWriter> stdoutConsole;
  std::shared_ptr<ConsoleWriter> stderrConsole;
  // --event_log_handler=console: torchelastic status events (agent/event_log.h) as JSON lines on
  // stderrConsole at the end of the run. rdzvBackend names the backend in them.
  bool eventLogToConsole = false;
  // --numa_binding: the CPUs of each local rank (index); empty: no binding.
  std::vector<std::vector<int>> workerCpus;
  std::string rdzvBackend = "static";
  // Told every event of this node (agent_events.h): its --timeline file, its metrics port.
  std::vector<std::shared_ptr<AgentObserver>> observers;
  std::string nodeId;  // this node's id in the job, for its events (empty: the host)
  // The workers' heartbeat channels (SocketHeartbeatSource; a fake in tests); null: no worker
  // beats, and every rank is judged by --finish_timeout alone.
  std::shared_ptr<HeartbeatSource> heartbeats;
  // torch's store, served by the agent for its workers (MASTER_ADDR:MASTER_PORT of every round,
  // TORCHELASTIC_USE_AGENT_STORE=True); null: rank 0 hosts its own TCPStore at the rendezvous'
  // MASTER_ADDR:MASTER_PORT.
  std::shared_ptr<TorchStore> torchStore;
  // --recovery=in_process (DESIGN.md section 11): when a rank fails and every other live rank runs
  // under the API (its beats say recoverable=1), only the failed rank is started again; the others
  // are told the next round on their channel and keep their processes. Otherwise, and with
  // kRestart, the whole group is stopped and started again.
  enum class Recovery { kRestart, kInProcess } recovery = Recovery::kRestart;
  // --spares_per_node (kInProcess only): warm spares kept running beside the ranks; a failed rank
  // is replaced by one at once (no import, no start-up), and a new spare starts behind it.
  int sparesPerNode = 0;
  // With spares: a node that has waited this long for its first round (a standby node, or one
  // that came early) starts its ranks' processes as spares, so that the round starts them warm.
  // Not at once: a job whose round forms quickly starts its ranks as ranks, as without spares.
  std::chrono::milliseconds warmStartAfter{2000};
  // The clock heartbeats are judged by (silence, --finish_timeout's "beat within"); tests fake it.
  std::function<std::chrono::steady_clock::time_point()> clock;
};

class ElasticAgent final : public RendezvousListener {
 public:
  ElasticAgent(boost::asio::io_context& io, Rendezvous& rendezvous, ProcessSupervisor& supervisor,
               AgentOptions options);
  ~ElasticAgent() override;

  // Joins the rendezvous. `onFinished` runs once, when the job is over for this node.
  void start(std::function<void(int exitStatus)> onFinished);
  // A signal reached ddprun: forward it to the workers, SIGKILL after the grace period (at once on
  // a second SIGINT within a second), then finish with 128+sig.
  void handleSignal(int sig);

  void onRoundReady(const RoundInfo& round) override;
  void onRoundInterrupted(uint64_t round, const std::string& reason) override;
  void onJobClosed(const JobClosure& closure) override;
  void onFenced(uint64_t round, const std::string& reason, std::chrono::milliseconds killWithin) override;
  void onPeerFinished(uint64_t round, int rank, const std::string& node) override;
  void onJobHealth(const JobHealthView& view) override;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun
