#include "agent/elastic_agent.h"

#include <signal.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "agent/event_log.h"
#include "agent/failure_report.h"
#include "agent/filtered_log.h"
#include "agent/hang_attribution.h"
#include "agent/hang_detector.h"
#include "agent/stack_dump.h"
#include "agent/straggler_detector.h"
#include "agent/worker_env.h"
#include "agent/worker_group.h"
#include "common/error.h"
#include "common/store_prefix.h"
#include "common/strings.h"
#include "common/unique_fd.h"

namespace ddprun {

class ElasticAgent::Impl {
 public:
  Impl(boost::asio::io_context& io, Rendezvous& rendezvous, ProcessSupervisor& supervisor, AgentOptions options)
      : io_(io), rendezvous_(rendezvous), supervisor_(supervisor), options_(std::move(options)), healthTimer_(io),
        finishTimer_(io), dumpTimer_(io) {
    if (!options_.stdoutConsole) options_.stdoutConsole = std::make_shared<ConsoleWriter>(ConsoleWriterOptions{1});
    if (!options_.stderrConsole) options_.stderrConsole = std::make_shared<ConsoleWriter>(ConsoleWriterOptions{2});
    if (!options_.canDumpStack) options_.canDumpStack = isPythonProcess;
  }

  void start(ElasticAgent* self, std::function<void(int)> onFinished) {
    onFinished_ = std::move(onFinished);
    // Always listening: heartbeats also tell a rank alive past --finish_timeout, and how far an
    // attempt got; only --hang_timeout makes silence a hang.
    auto onHung = [this](const HungRank& hung) { this->onHung(hung); };
    hangDetector_ = options_.hangTimeoutAuto
                        ? std::make_unique<HangDetector>(io_, HangCalibrationRules{}, onHung)
                        : std::make_unique<HangDetector>(io_, options_.hangTimeout, onHung);
    hangDetector_->setOnStepTime([this](int rank, double seconds) {
      for (auto& o : options_.observers) o->onStep(rank - currentRound_.rankOffset, seconds);
      onStepTime(rank, seconds);
    });
    scheduleHealthReport();
    supervisor_.setExitHandler([this](const ProcessExit& exit) {
      if (group_ && group_->handleExit(exit)) return;
      spdlog::debug("exit of pid {} belongs to no running worker", exit.pid);
    });
    emit(agentEvent(AgentEvent::Kind::kJoining, 0));
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
    if (round == currentRound_.round) emit(agentEvent(AgentEvent::Kind::kRoundInterrupted, round, reason));
    if (group_ && !groupStopped_ && round == currentRound_.round && dumping_.empty()) {
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
    emit(agentEvent(AgentEvent::Kind::kFenced, round, reason));
    if (hangDetector_) hangDetector_->disarm();
    if (killWithin.count() <= 0) {
      group_->killNow();
    } else {
      group_->stop(SIGTERM, std::min(killWithin, options_.shutdownGrace));
    }
  }

  void onPeerFinished(uint64_t round, int rank, const std::string& node) {
    if (finished_ || !group_ || groupStopped_ || round != currentRound_.round) return;
    if (!peerFinished_) peerFinished_ = PeerFinished{rank, node};
    startFinishTimer();
  }

  void onJobHealth(const JobHealthView& view) {
    if (finished_) return;
    if (hangDetector_) hangDetector_->adoptSections(view.sections);
    std::set<int> now;
    for (const auto& s : view.stragglers) {
      now.insert(s.rank);
      if (jobStragglers_.count(s.rank)) continue;
      char text[160];
      std::snprintf(text, sizeof(text), "takes %.4fs of its own work per step, %.1fx the job's median %.4fs of %d ranks",
                    s.seconds, view.medianSeconds > 0 ? s.seconds / view.medianSeconds : 0.0, view.medianSeconds,
                    view.ranks);
      spdlog::warn("straggler across the job: rank {} on node {} {}", s.rank, s.node, text);
      emitStraggler(s.rank, s.seconds, false, std::string("across the job, on node ") + s.node + ": " + text);
    }
    for (int rank : jobStragglers_) {
      if (now.count(rank)) continue;
      spdlog::warn("straggler across the job: rank {} is back near the job's median", rank);
      emitStraggler(rank, 0, true, "across the job: back near the job's median");
    }
    jobStragglers_ = std::move(now);
  }

  void onJobClosed(const JobClosure& closure) {
    if (finished_ || jobClosed_) return;  // the first closure is the job's
    pendingRound_.reset();
    jobClosed_ = closure.outcome;
    closeReason_ = closure.reason;
    jobFailure_ = closure.failure;
    jobFailedNode_ = closure.failedNode;
    closureStatus_ = closure.exitStatus;
    // (A hang's stack dumps are awaited first; the group is stopped when they are in.)
    if (closure.outcome == JobOutcome::kFailed && group_ && !groupStopped_ && dumping_.empty()) {
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
      fs::path dir = options_.flatRunDir ? fs::path(options_.runDir) / ("store_round_" + std::to_string(round.round))
                                         : fs::path(options_.runDir) / "store" / ("round_" + std::to_string(round.round));
      std::error_code ec;
      fs::remove_all(dir, ec);
      fs::create_directories(dir, ec);
      if (ec) throw ConfigError("cannot create " + dir.string() + ": " + ec.message());
      round.storeAddr = "file://" + dir.string();
      round.storePrefix = storePrefix(options_.runId, round.round);
    }
    judgeAttempt(round.restartCount > currentRound_.restartCount);  // the attempt that ended, if not yet
    attemptJudged_ = false;
    currentRound_ = round;
    groupStopped_ = false;
    firstFailure_.reset();
    finishedRanks_.clear();
    stragglers_.newAttempt();
    peerFinished_.reset();
    reportedFinish_ = false;
    finishTimer_.cancel();
    finishTimerArmed_ = false;
    dumpTimer_.cancel();
    dumping_.clear();
    stacks_.clear();
    diagnosis_.clear();
    recorderAttributed_ = false;
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
      onRankFinished(exit);
    };
    events.onFirstFailure = [this](const WorkerExit& exit) { onWorkerFailed(exit); };
    events.onSucceeded = [this] { onGroupSucceeded(); };
    events.onStopped = [this] { onGroupStopped(); };
    group_ = std::make_unique<WorkerGroup>(io_, supervisor_, std::move(specs), std::move(events));
    if (hangDetector_) hangDetector_->arm();
    emit(roundFormedEvent(round));
    group_->start();
    for (int localRank = 0; localRank < options_.nprocPerNode; ++localRank) {
      WorkerExit w;
      w.localRank = localRank;
      w.rank = round.rankOffset + localRank;
      w.pid = group_->pid(localRank);
      emit(workerEvent(AgentEvent::Kind::kWorkerStarted, round.round, w));
    }
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
    const std::string attempt = "attempt_" + std::to_string(round.restartCount);
    fs::path dir = fs::path(options_.runDir) / attempt / std::to_string(localRank);
    std::error_code ec;
    // A rank's files: attempt_N/<local rank>/NAME as torchrun lays them out, or, in ddprun's own
    // temporary folder, attempt_N.<local rank>.NAME beside each other (no folder to create and
    // remove per rank: on ext4 with discard that was a millisecond of every launch).
    auto rankFile = [&](const std::string& name) {
      return options_.flatRunDir ? (fs::path(options_.runDir) / (attempt + "." + std::to_string(localRank) + "." + name)).string()
                                 : (dir / name).string();
    };
    if (!options_.flatRunDir) {
      fs::create_directories(dir, ec);
      if (ec) throw ConfigError("cannot create " + dir.string() + ": " + ec.message());
    }

    WorkerEnvInputs envIn;
    envIn.inherited = options_.inherited;
    envIn.round = round;
    envIn.localRank = localRank;
    envIn.localWorldSize = options_.nprocPerNode;
    envIn.role = options_.role;
    envIn.maxRestarts = options_.maxRestarts;
    envIn.runId = options_.runId;
    envIn.errorFile = rankFile("error.json");
    envIn.virtualLocalRank = options_.virtualLocalRank;
    fs::remove(envIn.errorFile, ec);
    const std::string flightRecorder = rankFile("flight_recorder");
    fs::remove(flightRecorder, ec);

    WorkerSpec spec;
    spec.localRank = localRank;
    spec.rank = round.rankOffset + localRank;
    spec.errorFile = envIn.errorFile;
    spec.flightRecorder = flightRecorder;
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
    // A Python rank then dumps its stack on the SIGABRT that ends it when it hangs (stack_dump.h).
    if (!options_.inherited.get("PYTHONFAULTHANDLER")) spec.request.env.set("PYTHONFAULTHANDLER", "1");
    spec.request.env.set("DDPRUN_FLIGHT_RECORDER", flightRecorder);

    const LogOptions& log = options_.log;
    int redirected = log.redirects.forRank(localRank);
    int teed = log.tee.forRank(localRank);
    bool shown = log.consoleRanks.empty() || log.consoleRanks.count(localRank);
    auto& out = spec.output;
    out.prefix = expandPrefix(log.prefixTemplate, PrefixFields{spec.rank, localRank, options_.role, options_.host});
    if (shown && (!(redirected & kStdout) || (teed & kStdout))) out.stdoutConsole = options_.stdoutConsole;
    if (shown && (!(redirected & kStderr) || (teed & kStderr))) out.stderrConsole = options_.stderrConsole;
    if (options_.writeLogFiles || ((redirected | teed) & kStdout)) out.stdoutFile = rankFile("stdout.log");
    if (options_.writeLogFiles || ((redirected | teed) & kStderr)) out.stderrFile = rankFile("stderr.log");
    if (teed & kStdout) out.stdoutFiltered = filtered.out;
    if (teed & kStderr) out.stderrFiltered = filtered.err;
    return spec;
  }

  void onHung(const HungRank& hung) {
    if (!group_ || groupStopped_ || firstFailure_ || stopSignal_) return;
    int localRank = hung.rank - currentRound_.rankOffset;
    if (localRank < 0 || localRank >= options_.nprocPerNode || !group_->running(localRank)) return;
    WorkerExit exit;
    exit.localRank = localRank;
    exit.rank = hung.rank;
    exit.pid = group_->pid(localRank);
    exit.time = std::chrono::system_clock::now();
    exit.hangNote = "no heartbeat for " + std::to_string(hung.silentFor.count() / 1000.0).substr(0, 5) +
                    "s after step " + std::to_string(hung.lastStep) +
                    (hung.section.empty() ? "" : ", in section '" + hung.section + "'") +
                    (hung.calibrated ? " (bound " + formatSeconds(hung.bound) + ", learned by --hang_timeout=auto)"
                                     : "");
    spdlog::warn("rank {} is silent ({})", hung.rank, exit.hangNote);
    diagnoseAndStop(exit);
  }

  // --- stragglers (agent/straggler_detector.h) -------------------------------------------------

  void onStepTime(int rank, double seconds) {
    for (const auto& c : stragglers_.observe(rank, seconds, std::chrono::steady_clock::now())) {
      char text[256];
      if (c.straggling) {
        std::snprintf(text, sizeof(text),
                      "straggler: rank %d takes %.4fs of its own work per step (median of its last steps), "
                      "%.1fx the median %.4fs of the %d ranks on this node",
                      c.rank, c.seconds, c.median > 0 ? c.seconds / c.median : 0.0, c.median, c.ranks);
      } else {
        std::snprintf(text, sizeof(text), "straggler: rank %d is back to %.3fs per step (median %.3fs)", c.rank,
                      c.seconds, c.median);
      }
      spdlog::warn("{}", text);
      emitStraggler(c.rank, c.seconds, !c.straggling, text);
    }
  }

  // This node's part of the job-wide health view (rendezvous/rules/job_health.h): its ranks'
  // median step times and its learned hang bounds, every second; the rendezvous sends it with a
  // heartbeat when it changed.
  void scheduleHealthReport() {
    healthTimer_.expires_after(std::chrono::seconds(1));
    healthTimer_.async_wait([this](const boost::system::error_code& ec) {
      if (ec || finished_) return;
      NodeHealth health;
      health.stepSeconds = stragglers_.medians();
      if (hangDetector_) health.sections = hangDetector_->learnedSections();
      if (!health.stepSeconds.empty() || !health.sections.empty()) rendezvous_.reportHealth(health);
      scheduleHealthReport();
    });
  }

  // --- --finish_timeout ---------------------------------------------------------------------

  void onRankFinished(const WorkerExit& exit) {
    emit(workerEvent(AgentEvent::Kind::kWorkerSucceeded, currentRound_.round, exit));
    finishedRanks_.insert(exit.rank);
    if (!reportedFinish_) {
      reportedFinish_ = true;
      rendezvous_.reportRankFinished(currentRound_.round, exit.rank);
    }
    startFinishTimer();
  }

  void startFinishTimer() {
    if (options_.finishTimeout.count() <= 0 || finishTimerArmed_ || !group_ || groupStopped_) return;
    finishTimerArmed_ = true;
    finishStarted_ = std::chrono::steady_clock::now();
    scheduleFinishCheck(options_.finishTimeout);
  }

  void scheduleFinishCheck(std::chrono::milliseconds after) {
    const uint64_t round = currentRound_.round;
    finishTimer_.expires_after(after);
    finishTimer_.async_wait([this, round](const boost::system::error_code& ec) {
      if (!ec && round == currentRound_.round) checkFinish();
    });
  }

  // The bound has passed since the first rank finished: every rank still running here that has
  // not beaten within the bound is hung. One that beats is alive (an epilogue that says so) and is
  // looked at again when its silence could reach the bound.
  void checkFinish() {
    if (finished_ || !group_ || groupStopped_ || firstFailure_ || stopSignal_) return;
    std::vector<int> hung;
    std::chrono::milliseconds nextCheck = options_.finishTimeout;
    for (int localRank = 0; localRank < options_.nprocPerNode; ++localRank) {
      if (!group_->running(localRank)) continue;
      const int rank = currentRound_.rankOffset + localRank;
      auto silent = hangDetector_ ? hangDetector_->silentFor(rank) : std::nullopt;
      if (silent && *silent < options_.finishTimeout) {
        nextCheck = std::min(nextCheck, options_.finishTimeout - *silent);
        continue;
      }
      hung.push_back(localRank);
    }
    if (hung.empty()) {
      if (!group_->allExited()) scheduleFinishCheck(std::max(nextCheck, std::chrono::milliseconds(10)));
      return;
    }
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                              finishStarted_);
    std::string finished;
    for (int rank : finishedRanks_) finished += (finished.empty() ? "" : ", ") + ("rank " + std::to_string(rank));
    if (peerFinished_ && !finishedRanks_.count(peerFinished_->rank)) {
      finished += (finished.empty() ? "" : ", ") + ("rank " + std::to_string(peerFinished_->rank)) +
                  (peerFinished_->node.empty() ? "" : " (node " + peerFinished_->node + ")");
    }
    std::string running;
    for (int localRank : hung) {
      running += (running.empty() ? "" : ", ") + ("rank " + std::to_string(currentRound_.rankOffset + localRank));
    }
    const std::string seconds = formatSeconds(waited);
    diagnosis_ = "job hung at its end: finished: " + finished + "; still running: " + running + ", " + seconds +
                 " after the first rank finished (--finish_timeout=" + formatSeconds(options_.finishTimeout) +
                 "). This usually means uneven inputs: some ranks ran out of data and exited while the others "
                 "wait in a collective for them. Give every rank the same number of batches (DistributedSampler "
                 "with drop_last=True), or let ranks that finish early shadow the others' collectives with "
                 "torch.distributed.algorithms.Join. A rank whose epilogue outlasts the bound should call "
                 "ddprun.heartbeat() in it, or raise --finish_timeout.";
    WorkerExit exit;
    exit.localRank = hung.front();
    exit.rank = currentRound_.rankOffset + hung.front();
    exit.pid = group_->pid(hung.front());
    exit.time = std::chrono::system_clock::now();
    exit.hangNote = "still running " + seconds + " after " + (finished.empty() ? "a rank" : finished) +
                    " finished (--finish_timeout)";
    diagnoseAndStop(exit);
  }

  static std::string formatSeconds(std::chrono::milliseconds d) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.1fs", static_cast<double>(d.count()) / 1000.0);
    return buf;
  }

  // --- evidence before the kill (stack_dump.h) ----------------------------------------------

  // A hang was declared (`exit` is the rank blamed): tell the rendezvous, take the Python stack of
  // every rank still running here (SIGABRT under PYTHONFAULTHANDLER), wait for the dumps at most
  // stackDumpWait, then stop the group as for any failure.
  void diagnoseAndStop(WorkerExit exit) {
    // SDK ranks: the flight recorder knows which rank is behind; the first to go silent may be
    // one that waits for it. Blame the one behind when it is here and still runs.
    const std::vector<int> behind = attributeFromFlightRecorders();
    recorderAttributed_ = !behind.empty();
    if (behind.size() == 1 && behind[0] != exit.rank) {
      const int localRank = behind[0] - currentRound_.rankOffset;
      if (localRank >= 0 && localRank < options_.nprocPerNode && group_->running(localRank)) {
        exit.hangNote = "never started the collective that rank " + std::to_string(exit.rank) + " waits in (rank " +
                        std::to_string(exit.rank) + ": " + exit.hangNote + ")";
        exit.rank = behind[0];
        exit.localRank = localRank;
        exit.pid = group_->pid(localRank);
      }
    }
    firstFailure_ = exit;
    group_->markFailed();
    if (hangDetector_) hangDetector_->disarm();
    finishTimer_.cancel();
    const std::string how = "is hung (" + exit.hangNote + ")";
    spdlog::warn("worker rank {} (local_rank {}, pid {}) {}; taking the stacks of the running ranks", exit.rank,
                 exit.localRank, exit.pid, how);
    emit(workerEvent(AgentEvent::Kind::kHang, currentRound_.round, exit, exit.hangNote));
    emit(workerEvent(AgentEvent::Kind::kWorkerFailed, currentRound_.round, exit, how));
    reportFailure(exit, how.substr(0, 200));
    for (int localRank = 0; localRank < options_.nprocPerNode; ++localRank) {
      if (!group_->running(localRank)) continue;
      FailureReportInput::RankStack stack{currentRound_.rankOffset + localRank, localRank, {}, {}};
      if (options_.canDumpStack(group_->pid(localRank))) {
        group_->signalWorker(localRank, SIGABRT);
        dumping_.insert(localRank);
      } else {
        stack.missing = "no Python stack (not a Python process)";
      }
      stacks_.push_back(std::move(stack));
    }
    dumpDeadline_ = std::chrono::steady_clock::now() + options_.stackDumpWait;
    awaitDumps();
  }

  // SDK workers: the last collectives of every local rank, read while the ranks still hang, merged
  // into the line that names the rank that is behind (agent/hang_attribution.h).
  std::vector<int> attributeFromFlightRecorders() {
    std::vector<RankCollectives> ranks;
    for (int localRank = 0; localRank < options_.nprocPerNode; ++localRank) {
      auto records = readFlightRecorder(group_->spec(localRank).flightRecorder);
      if (records) ranks.push_back(RankCollectives{currentRound_.rankOffset + localRank, std::move(*records)});
    }
    const HangAttribution found = attributeHang(ranks);
    if (found.line.empty()) return {};
    spdlog::warn("flight recorder: {}", found.line);
    std::string text = "flight recorder: " + found.line;
    for (const auto& rank : ranks) text += "\n  " + describeRecent(rank);
    diagnosis_ = diagnosis_.empty() ? text : diagnosis_ + "\n" + text;
    return found.behind;
  }

  void awaitDumps() {
    bool pending = false;
    for (int localRank : dumping_) pending = pending || group_->running(localRank);
    if (!pending || std::chrono::steady_clock::now() >= dumpDeadline_) {
      collectDumps();
      group_->stop(SIGTERM, options_.shutdownGrace);
      return;
    }
    dumpTimer_.expires_after(std::chrono::milliseconds(20));
    const uint64_t round = currentRound_.round;
    dumpTimer_.async_wait([this, round](const boost::system::error_code& ec) {
      if (!ec && round == currentRound_.round && group_ && !groupStopped_) awaitDumps();
    });
  }

  void collectDumps() {
    for (auto& stack : stacks_) {
      if (!dumping_.count(stack.localRank)) continue;
      group_->drainOutput(stack.localRank);
      stack.lines = faulthandlerDump(group_->stderrTail(stack.localRank));
      if (stack.lines.empty()) {
        stack.missing = group_->running(stack.localRank)
                            ? "no stack within " + formatSeconds(options_.stackDumpWait) + " (skipped)"
                            : "no stack: the rank ended without a faulthandler dump (PYTHONFAULTHANDLER off?)";
      }
    }
    dumping_.clear();
    attributeFromStacks();
  }

  // Python ranks: the first to go silent may be one that waits for the rank behind (it beat
  // last just before entering the collective). Their stacks, now taken, can tell which is behind
  // (agent/hang_attribution.h); the verdict already given stands, and the report says so.
  void attributeFromStacks() {
    if (!firstFailure_ || firstFailure_->hangNote.empty() || recorderAttributed_) return;
    std::vector<RankStackLines> ranks;
    for (const auto& stack : stacks_) ranks.push_back(RankStackLines{stack.rank, stack.lines});
    const HangAttribution found = ddprun::attributeFromStacks(ranks);
    if (found.behind.size() != 1 || found.behind[0] == firstFailure_->rank) return;
    const std::string text = "stacks: " + found.line + " (rank " + std::to_string(firstFailure_->rank) +
                             ", the first to go silent, waits for it)";
    spdlog::warn("{}", text);
    diagnosis_ = diagnosis_.empty() ? text : diagnosis_ + "\n" + text;
  }

  void onWorkerFailed(const WorkerExit& exit) {
    if (firstFailure_) return;  // a hang was declared first; this exit is its stack dump
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
    emit(workerEvent(AgentEvent::Kind::kWorkerFailed, currentRound_.round, exit, how));
    // Tell the rendezvous first, so that peers restart while this node is still stopping.
    reportFailure(exit, how);
    group_->stop(SIGTERM, options_.shutdownGrace);
  }

  void reportFailure(const WorkerExit& exit, const std::string& how) {
    WorkerFailure failure{exit.rank, exit.exitCode, exit.signal, exitStatusOf(exit), how};
    judgeAttempt(true);
    if (options_.stopWithoutProgress > 0 && everBeat_ && restartsWithoutProgress_ >= options_.stopWithoutProgress) {
      failure.attemptsWithoutProgress = restartsWithoutProgress_;
      std::string note = std::to_string(restartsWithoutProgress_) + " restarts in a row made no progress (no rank " +
                         "beat a step beyond " + std::to_string(highWater_.value_or(0)) +
                         ", the best of the attempts before): the job is stopped instead of restarted again " +
                         "(--stop_without_progress=" + std::to_string(options_.stopWithoutProgress) + ")";
      diagnosis_ = diagnosis_.empty() ? note : diagnosis_ + "\n" + note;
      spdlog::error("{}", note);
    }
    rendezvous_.reportWorkerFailure(currentRound_.round, failure);
  }

  // --stop_without_progress: an attempt made progress when a rank beat a step beyond the best of
  // every attempt before it (a job resumed from a checkpoint that fails at the same step again
  // makes none). Judged once per attempt; only attempts that end in a restart count in the streak.
  void judgeAttempt(bool endsInRestart) {
    if (attemptJudged_ || !group_) return;
    attemptJudged_ = true;
    const auto best = hangDetector_ ? hangDetector_->bestStep() : std::nullopt;
    const bool progressed = best && (!highWater_ || *best > *highWater_);
    if (best) {
      everBeat_ = true;
      highWater_ = std::max(highWater_.value_or(*best), *best);
    }
    if (progressed) {
      restartsWithoutProgress_ = 0;
    } else if (endsInRestart && currentRound_.restartCount > 0) {
      ++restartsWithoutProgress_;
    }
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
    if (closureStatus_ == kExitExcluded) {
      // Not the job's end: this node is out of it (--exclude_node_after), the others go on.
      if (lastFailure_) options_.stderrConsole->write(formatFailureReport(*lastFailure_));
      spdlog::error("{}; the job goes on without this node. Exit {}: do not restart it on this host "
                    "(README \"Exit status\")", closeReason_, kExitExcluded);
      finish(kExitExcluded);
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
    return gatherFailureReport(*group_, first, options_.programName, options_.host, diagnosis_, stacks_);
  }

  void finish(int status) {
    if (finished_) return;
    finished_ = true;
    healthTimer_.cancel();
    if (group_ && !group_->allExited()) group_->killNow();
    AgentEvent ended = agentEvent(AgentEvent::Kind::kJobEnded, currentRound_.round,
                                  stopSignal_ ? "stopped by " + signalName(*stopSignal_) : closeReason_);
    ended.exitStatus = status;
    emit(std::move(ended));
    if (options_.eventLogToConsole) recordStatusEvents(status);
    if (onFinished_) onFinished_(status);
  }

  // To every observer, numbered by what the rendezvous said last (agent_events.h).
  void emit(AgentEvent e) {
    if (options_.observers.empty()) return;
    e.seq = rendezvous_.lastEventSeq();
    e.node = options_.nodeId.empty() ? options_.host : options_.nodeId;
    e.time = std::chrono::system_clock::now();
    for (auto& o : options_.observers) o->onEvent(e);
  }
  void emitStraggler(int rank, double seconds, bool back, std::string reason) {
    AgentEvent e = agentEvent(AgentEvent::Kind::kStraggler, currentRound_.round, std::move(reason));
    e.rank = rank;
    e.seconds = seconds;
    e.back = back;
    emit(std::move(e));
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
    options_.stderrConsole->write(formatRunEndEvents(base, group_.get(), options_.nprocPerNode, currentRound_.worldSize,
                                                     status));
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
  StragglerDetector stragglers_;
  boost::asio::steady_timer healthTimer_;
  std::set<int> jobStragglers_;  // the stragglers of the job-wide view last told
  // --stop_without_progress, across attempts.
  std::optional<int64_t> highWater_;  // the best step of the attempts judged so far
  bool everBeat_ = false;
  int restartsWithoutProgress_ = 0;
  bool attemptJudged_ = false;
  // --finish_timeout, for the current round.
  struct PeerFinished {
    int rank = 0;
    std::string node;
  };
  boost::asio::steady_timer finishTimer_;
  bool finishTimerArmed_ = false;
  std::chrono::steady_clock::time_point finishStarted_;
  std::set<int> finishedRanks_;  // local ranks that exited 0
  std::optional<PeerFinished> peerFinished_;
  bool reportedFinish_ = false;
  // A hang's evidence, for the current round.
  boost::asio::steady_timer dumpTimer_;
  std::chrono::steady_clock::time_point dumpDeadline_;
  std::set<int> dumping_;  // local ranks sent SIGABRT whose dump is awaited
  std::vector<FailureReportInput::RankStack> stacks_;
  std::string diagnosis_;
  bool recorderAttributed_ = false;  // this attempt's hang was attributed by the flight recorders
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
void ElasticAgent::onPeerFinished(uint64_t round, int rank, const std::string& node) {
  impl_->onPeerFinished(round, rank, node);
}
void ElasticAgent::onJobHealth(const JobHealthView& view) { impl_->onJobHealth(view); }

}  // namespace ddprun
