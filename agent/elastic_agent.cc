#include "agent/elastic_agent.h"

#include <signal.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <filesystem>
#include <optional>

#include "agent/event_log.h"
#include "agent/failure_report.h"
#include "agent/filtered_log.h"
#include "agent/hang_detector.h"
#include "agent/worker_env.h"
#include "agent/worker_group.h"
#include "common/error.h"
#include "common/unique_fd.h"

namespace ddprun {

class ElasticAgent::Impl {
 public:
  Impl(boost::asio::io_context& io, Rendezvous& rendezvous, ProcessSupervisor& supervisor, AgentOptions options)
      : io_(io), rendezvous_(rendezvous), supervisor_(supervisor), options_(std::move(options)) {
    if (!options_.stdoutConsole) options_.stdoutConsole = std::make_shared<ConsoleWriter>(ConsoleWriterOptions{1});
    if (!options_.stderrConsole) options_.stderrConsole = std::make_shared<ConsoleWriter>(ConsoleWriterOptions{2});
  }

  void start(ElasticAgent* self, std::function<void(int)> onFinished) {
    onFinished_ = std::move(onFinished);
    if (options_.hangTimeout.count() > 0) {
      hangDetector_ = std::make_unique<HangDetector>(io_, options_.hangTimeout,
                                                     [this](const HungRank& hung) { onHung(hung); });
    }
    supervisor_.setExitHandler([this](const ProcessExit& exit) {
      if (group_ && group_->handleExit(exit)) return;
      spdlog::debug("exit of pid {} belongs to no running worker", exit.pid);
    });
    rendezvous_.join(self);
  }

  void handleSignal(int sig) {
    if (finished_) return;
    auto now = std::chrono::steady_clock::now();
    bool escalate = sig == SIGINT && lastSigint_ && now - *lastSigint_ < std::chrono::seconds(1);
    if (sig == SIGINT) lastSigint_ = now;
    if (!stopSignal_) {
      stopSignal_ = sig;
      spdlog::warn("received {}: stopping workers ({}s grace, then SIGKILL)", signalName(sig),
                   options_.shutdownGrace.count() / 1000.0);
      pendingRound_.reset();
      rendezvous_.leave();
      oweStopReport(std::max(currentRound_.round, stopOwed_.value_or(0)));
    }
    if (!group_ || groupStopped_) {
      settleStopReport();
      finish(128 + *stopSignal_);
      return;
    }
    if (escalate) {
      spdlog::warn("second SIGINT: killing workers now");
      group_->killNow();
    } else {
      group_->stop(sig, options_.shutdownGrace);
    }
  }

  void onRoundReady(const RoundInfo& round) {
    if (finished_ || stopSignal_) return;
    pendingRound_ = round;
    maybeStartPendingRound();
  }

  void onRoundInterrupted(uint64_t round, const std::string& reason) {
    const uint64_t known = std::max(currentRound_.round, pendingRound_ ? pendingRound_->round : 0);
    if (finished_ || round > known) return;  // not a round this node was told of
    // A round interrupted before its workers started here (the last ones were still stopping)
    // never starts.
    if (pendingRound_ && pendingRound_->round <= round) pendingRound_.reset();
    if (group_ && !groupStopped_ && round == currentRound_.round) {
      spdlog::info("round {} interrupted: {}; stopping workers", round, reason);
      group_->stop(SIGTERM, options_.shutdownGrace);
    }
    oweStopReport(round);
    settleStopReport();
  }

  // Fencing (docs/rendezvous.md): the server may form a round without this node soon, so the
  // workers get a short grace, not the shutdown grace.
  void onFenced(uint64_t round, const std::string& reason, std::chrono::milliseconds killWithin) {
    if (finished_ || !group_ || groupStopped_ || round != currentRound_.round) return;
    spdlog::warn("round {} fenced ({}): stopping workers, SIGKILL in {}ms", round, reason, killWithin.count());
    if (hangDetector_) hangDetector_->disarm();
    if (killWithin.count() <= 0) {
      group_->killNow();
    } else {
      group_->stop(SIGTERM, std::min(killWithin, options_.shutdownGrace));
    }
  }

  void onJobClosed(const JobClosure& closure) {
    if (finished_ || jobClosed_) return;  // the first closure is the job's
    pendingRound_.reset();
    jobClosed_ = closure.outcome;
    closeReason_ = closure.reason;
    jobFailure_ = closure.failure;
    jobFailedNode_ = closure.failedNode;
    closureStatus_ = closure.exitStatus;
    if (closure.outcome == JobOutcome::kFailed && group_ && !groupStopped_) {
      group_->stop(SIGTERM, options_.shutdownGrace);
    }
    maybeFinishClosedJob();
  }

 private:
  void maybeStartPendingRound() {
    if (finished_ || jobClosed_ || !pendingRound_ || (group_ && !groupStopped_)) return;
    RoundInfo round = *pendingRound_;
    pendingRound_.reset();
    if (round.restartCount > 0) {
      spdlog::warn("restarting workers: attempt {} of {} (round {})", round.restartCount + 1, options_.maxRestarts + 1,
                   round.round);
    }
    startGroup(round);
  }

  void startGroup(RoundInfo round) {
    if (round.storeAddr.empty()) {
      // Single node: the workers' store is a folder per round (the SDK's file store); nothing to
      // serve, and a restarted group starts from an empty folder.
      namespace fs = std::filesystem;
      fs::path dir = fs::path(options_.runDir) / "store" / ("round_" + std::to_string(round.round));
      std::error_code ec;
      fs::remove_all(dir, ec);
      fs::create_directories(dir, ec);
      if (ec) throw ConfigError("cannot create " + dir.string() + ": " + ec.message());
      round.storeAddr = "file://" + dir.string();
      round.storePrefix = "/run/" + options_.runId + "/round/" + std::to_string(round.round) + "/";
    }
    currentRound_ = round;
    groupStopped_ = false;
    firstFailure_.reset();
    std::vector<WorkerSpec> specs;
    const FilteredLogs filtered = openFilteredLogs(round);
    for (int localRank = 0; localRank < options_.nprocPerNode; ++localRank) {
      specs.push_back(makeSpec(round, localRank, filtered));
    }
    group_.reset();  // the previous attempt's group has stopped and been swept
    WorkerGroupEvents events;
    // A rank that finished beats no more: it is not hung (seed 001: the ranks that finished are
    // not the ones to blame; the ones still waiting are).
    events.onSucceededWorker = [this](const WorkerExit& exit) {
      if (hangDetector_) hangDetector_->forget(exit.rank);
    };
    events.onFirstFailure = [this](const WorkerExit& exit) { onWorkerFailed(exit); };
    events.onSucceeded = [this] { onGroupSucceeded(); };
    events.onStopped = [this] { onGroupStopped(); };
    group_ = std::make_unique<WorkerGroup>(io_, supervisor_, std::move(specs), std::move(events));
    if (hangDetector_) hangDetector_->arm();
    group_->start();
  }

  struct FilteredLogs {
    std::shared_ptr<FilteredLog> out;
    std::shared_ptr<FilteredLog> err;
  };

  // One file per stream and attempt, shared by the ranks, as torchrun's.
  FilteredLogs openFilteredLogs(const RoundInfo& round) {
    namespace fs = std::filesystem;
    const LogOptions& log = options_.log;
    FilteredLogs logs;
    if (log.duplicateStdoutFilters.empty() && log.duplicateStderrFilters.empty()) return logs;
    fs::path dir = fs::path(options_.runDir) / ("attempt_" + std::to_string(round.restartCount));
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw ConfigError("cannot create " + dir.string() + ": " + ec.message());
    if (!log.duplicateStdoutFilters.empty()) {
      logs.out = std::make_shared<FilteredLog>((dir / "filtered_stdout.log").string(), log.duplicateStdoutFilters);
    }
    if (!log.duplicateStderrFilters.empty()) {
      logs.err = std::make_shared<FilteredLog>((dir / "filtered_stderr.log").string(), log.duplicateStderrFilters);
    }
    return logs;
  }

  WorkerSpec makeSpec(const RoundInfo& round, int localRank, const FilteredLogs& filtered) {
    namespace fs = std::filesystem;
    fs::path dir = fs::path(options_.runDir) / ("attempt_" + std::to_string(round.restartCount)) /
                   std::to_string(localRank);
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw ConfigError("cannot create " + dir.string() + ": " + ec.message());

    WorkerEnvInputs envIn;
    envIn.inherited = options_.inherited;
    envIn.round = round;
    envIn.localRank = localRank;
    envIn.localWorldSize = options_.nprocPerNode;
    envIn.role = options_.role;
    envIn.maxRestarts = options_.maxRestarts;
    envIn.runId = options_.runId;
    envIn.errorFile = (dir / "error.json").string();
    envIn.virtualLocalRank = options_.virtualLocalRank;
    fs::remove(envIn.errorFile, ec);

    WorkerSpec spec;
    spec.localRank = localRank;
    spec.rank = round.rankOffset + localRank;
    spec.errorFile = envIn.errorFile;
    spec.request.executable = options_.executable;
    spec.request.args = options_.args;
    if (!options_.localRankArg.empty()) {
      auto at = spec.request.args.begin() + static_cast<std::ptrdiff_t>(std::min(options_.localRankArgAt, spec.request.args.size()));
      spec.request.args.insert(at, options_.localRankArg + "=" + std::to_string(localRank));
    }
    spec.request.env = buildWorkerEnv(envIn);
    if (static_cast<std::size_t>(localRank) < options_.workerCpus.size()) {
      spec.request.cpus = options_.workerCpus[static_cast<std::size_t>(localRank)];
    }
    if (hangDetector_) spec.request.env.set("DDPRUN_HEARTBEAT_SOCKET", hangDetector_->socketName());

    const LogOptions& log = options_.log;
    int redirected = log.redirects.forRank(localRank);
    int teed = log.tee.forRank(localRank);
    bool shown = log.consoleRanks.empty() || log.consoleRanks.count(localRank);
    auto& out = spec.output;
    out.prefix = expandPrefix(log.prefixTemplate, PrefixFields{spec.rank, localRank, options_.role, options_.host});
    if (shown && (!(redirected & kStdout) || (teed & kStdout))) out.stdoutConsole = options_.stdoutConsole;
    if (shown && (!(redirected & kStderr) || (teed & kStderr))) out.stderrConsole = options_.stderrConsole;
    if (options_.writeLogFiles || ((redirected | teed) & kStdout)) out.stdoutFile = (dir / "stdout.log").string();
    if (options_.writeLogFiles || ((redirected | teed) & kStderr)) out.stderrFile = (dir / "stderr.log").string();
    if (teed & kStdout) out.stdoutFiltered = filtered.out;
    if (teed & kStderr) out.stderrFiltered = filtered.err;
    return spec;
  }

  void onHung(const HungRank& hung) {
    if (!group_ || groupStopped_ || firstFailure_ || stopSignal_) return;
    int localRank = hung.rank - currentRound_.rankOffset;
    auto pids = group_->pids();
    if (localRank < 0 || localRank >= static_cast<int>(pids.size())) return;
    WorkerExit exit;
    exit.localRank = localRank;
    exit.rank = hung.rank;
    exit.pid = pids[localRank];
    exit.time = std::chrono::system_clock::now();
    exit.hangNote = "no heartbeat for " + std::to_string(hung.silentFor.count() / 1000.0).substr(0, 5) +
                    "s after step " + std::to_string(hung.lastStep) +
                    (hung.section.empty() ? "" : ", in section '" + hung.section + "'");
    spdlog::warn("rank {} is hung ({})", hung.rank, exit.hangNote);
    onWorkerFailed(exit);
  }

  void onWorkerFailed(const WorkerExit& exit) {
    if (rendezvous_.fenced(currentRound_.round)) {
      // Killed by the fence (this agent's or the watchdog's, while this process was frozen), or
      // ended while the node was cut off: not a failure of the job, and no restart is spent.
      spdlog::warn("worker rank {} (pid {}) of fenced round {} ended; stopping the others", exit.rank, exit.pid,
                   currentRound_.round);
      if (hangDetector_) hangDetector_->disarm();
      group_->killNow();
      return;
    }
    firstFailure_ = exit;
    if (hangDetector_) hangDetector_->disarm();
    std::string how = !exit.spawnError.empty() ? "could not be started (" + exit.spawnError + ")"
                      : !exit.hangNote.empty() ? "is hung"
                      : exit.signal      ? "was killed by " + signalName(exit.signal)
                                         : "failed with exit code " + std::to_string(exit.exitCode);
    spdlog::warn("worker rank {} (local_rank {}, pid {}) {}; stopping the others", exit.rank, exit.localRank, exit.pid,
                 how);
    // Tell the rendezvous first, so that peers restart while this node is still stopping.
    rendezvous_.reportWorkerFailure(currentRound_.round,
                                    WorkerFailure{exit.rank, exit.exitCode, exit.signal, exitStatusOf(exit), how});
    group_->stop(SIGTERM, options_.shutdownGrace);
  }

  void onGroupSucceeded() {
    groupStopped_ = true;
    supervisor_.sweepOrphans(group_->pids());
    rendezvous_.reportSucceeded(currentRound_.round);
    settleStopReport();
  }

  void onGroupStopped() {
    groupStopped_ = true;
    int swept = supervisor_.sweepOrphans(group_->pids());
    if (swept > 0) spdlog::info("killed {} leftover process(es) of the stopped workers", swept);
    if (firstFailure_) lastFailure_ = makeReport(*firstFailure_);
    settleStopReport();  // before anything else: other nodes' next round waits for it
    if (stopSignal_) {
      finish(128 + *stopSignal_);
      return;
    }
    maybeFinishClosedJob();
    maybeStartPendingRound();
  }

  // The hand-over (docs/rendezvous.md): every interruption of a round is answered with
  // reportStopped once no worker of that round or an older one runs here.
  void oweStopReport(uint64_t round) {
    if (round > 0) stopOwed_ = std::max(stopOwed_.value_or(0), round);
  }
  void settleStopReport() {
    if (!stopOwed_ || jobClosed_ || (group_ && !groupStopped_)) return;
    rendezvous_.reportStopped(*stopOwed_);
    stopOwed_.reset();
  }

  void maybeFinishClosedJob() {
    if (!jobClosed_ || (group_ && !groupStopped_)) return;
    if (*jobClosed_ == JobOutcome::kSucceeded) {
      finish(0);
      return;
    }
    // Every node exits with the status of the job's first failure (the one the rendezvous saw
    // first), so that a scheduler sees one exit code for the job; a node whose own workers failed
    // also prints their report.
    const bool firstIsElsewhere = jobFailure_ && (!lastFailure_ || jobFailure_->rank != lastFailure_->first.rank);
    if (lastFailure_) {
      options_.stderrConsole->write(formatFailureReport(*lastFailure_));
    }
    if (firstIsElsewhere) {
      spdlog::error("job failed: worker rank {}{} {} ({})", jobFailure_->rank,
                    jobFailedNode_.empty() ? "" : " on node " + jobFailedNode_,
                    jobFailure_->description.empty() ? "failed" : jobFailure_->description, closeReason_);
    } else if (!lastFailure_) {
      spdlog::error("job failed: {}", closeReason_);
    }
    finish(jobFailure_ ? jobFailure_->exitStatus : lastFailure_ ? exitStatusOf(lastFailure_->first) : closureStatus_);
  }

  FailureReportInput makeReport(const WorkerExit& first) {
    FailureReportInput in;
    in.program = options_.programName;
    in.host = options_.host;
    in.first = first;
    in.errorFile = group_->spec(first.localRank).errorFile;
    in.error = readErrorFile(in.errorFile);
    in.stderrTail = group_->stderrTail(first.localRank);
    for (const auto& e : group_->exits()) {
      bool causedByStop = e.signal == SIGTERM || e.signal == SIGKILL;
      if (e.localRank != first.localRank && !e.succeeded() && !causedByStop) in.others.push_back(e);
    }
    return in;
  }

  void finish(int status) {
    if (finished_) return;
    finished_ = true;
    if (group_ && !group_->allExited()) group_->killNow();
    if (options_.eventLogToConsole) recordStatusEvents(status);
    if (onFinished_) onFinished_(status);
  }

  // As torch's SimpleElasticAgent at the end of run(): one event per worker of the last group, then
  // the agent's.
  void recordStatusEvents(int status) {
    StatusEvent base;
    base.timestampMs = std::chrono::duration_cast<std::chrono::milliseconds>(
                           std::chrono::system_clock::now().time_since_epoch()).count();
    base.runId = options_.runId;
    base.role = options_.role;
    base.hostname = options_.host;
    base.rdzvBackend = options_.rdzvBackend;
    base.entryPoint = options_.programName;
    base.groupRank = currentRound_.groupRank;
    base.groupWorldSize = currentRound_.groupWorldSize;
    base.agentRestarts = currentRound_.restartCount;
    base.totalRunTimeS = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
    std::string lines;
    if (group_) {
      for (int localRank = 0; localRank < options_.nprocPerNode; ++localRank) {
        StatusEvent e = base;
        const WorkerSpec& spec = group_->spec(localRank);
        e.localRank = localRank;
        e.globalRank = spec.rank;
        e.roleWorldSize = currentRound_.worldSize;
        e.state = "UNKNOWN";
        for (const auto& exit : group_->exits()) {
          if (exit.localRank != localRank) continue;
          e.pid = exit.pid;
          e.exitCode = exit.signal ? -exit.signal : exit.exitCode;  // torch's negative signal numbers
          e.state = exit.succeeded() ? "SUCCEEDED" : "FAILED";
          if (!exit.succeeded()) {
            if (auto error = readErrorFile(spec.errorFile)) e.rawError = error->message;
          }
        }
        lines += formatStatusEvent(e) + "\n";
      }
    }
    StatusEvent agent = base;
    agent.fromWorker = false;
    agent.state = status == 0 ? "SUCCEEDED" : "FAILED";
    lines += formatStatusEvent(agent) + "\n";
    options_.stderrConsole->write(lines);
  }

  boost::asio::io_context& io_;
  Rendezvous& rendezvous_;
  ProcessSupervisor& supervisor_;
  AgentOptions options_;
  std::function<void(int)> onFinished_;
  std::unique_ptr<WorkerGroup> group_;
  bool groupStopped_ = false;
  RoundInfo currentRound_;
  std::optional<RoundInfo> pendingRound_;
  std::optional<uint64_t> stopOwed_;  // the round whose interruption awaits reportStopped
  std::optional<WorkerExit> firstFailure_;
  std::unique_ptr<HangDetector> hangDetector_;
  std::optional<FailureReportInput> lastFailure_;
  std::optional<JobOutcome> jobClosed_;
  std::string closeReason_;
  std::optional<WorkerFailure> jobFailure_;  // the job's first failure, when one ended it
  std::string jobFailedNode_;
  int closureStatus_ = kExitInfrastructure;  // the closure's status when no worker failure decides the exit status
  std::optional<int> stopSignal_;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  std::optional<std::chrono::steady_clock::time_point> lastSigint_;
  bool finished_ = false;
};

ElasticAgent::ElasticAgent(boost::asio::io_context& io, Rendezvous& rendezvous, ProcessSupervisor& supervisor,
                           AgentOptions options)
    : impl_(std::make_unique<Impl>(io, rendezvous, supervisor, std::move(options))) {}
ElasticAgent::~ElasticAgent() = default;
void ElasticAgent::start(std::function<void(int)> onFinished) { impl_->start(this, std::move(onFinished)); }
void ElasticAgent::handleSignal(int sig) { impl_->handleSignal(sig); }
void ElasticAgent::onRoundReady(const RoundInfo& round) { impl_->onRoundReady(round); }
void ElasticAgent::onRoundInterrupted(uint64_t round, const std::string& reason) {
  impl_->onRoundInterrupted(round, reason);
}
void ElasticAgent::onJobClosed(const JobClosure& closure) { impl_->onJobClosed(closure); }
void ElasticAgent::onFenced(uint64_t round, const std::string& reason, std::chrono::milliseconds killWithin) {
  impl_->onFenced(round, reason, killWithin);
}

}  // namespace ddprun
