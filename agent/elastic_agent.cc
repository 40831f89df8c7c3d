#include "agent/elastic_agent.h"

#include <fmt/format.h>

#include <signal.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <map>
#include <optional>
#include <set>

#include "agent/attempt.h"
#include "agent/event_log.h"
#include "agent/exit_decision.h"
#include "agent/failure_report.h"
#include "agent/hang_detector.h"
#include "agent/hang_evidence.h"
#include "agent/in_process_recovery.h"
#include "agent/progress_judge.h"
#include "agent/stack_dump.h"  // isPythonProcess
#include "agent/straggler_detector.h"
#include "agent/straggler_reports.h"
#include "agent/torch_store.h"
#include "agent/warm_spares.h"
#include "agent/worker_group.h"
#include "agent/worker_specs.h"
#include "common/error.h"
#include "common/net.h"
#include "common/store_prefix.h"
#include "common/strings.h"

namespace ddprun {

class ElasticAgent::Impl {
 public:
  Impl(boost::asio::io_context& io, Rendezvous& rendezvous, ProcessSupervisor& supervisor, AgentOptions options)
      : io_(io), rendezvous_(rendezvous), supervisor_(supervisor), options_(std::move(options)),
        specs_(options_), attempt_(RoundInfo{}, options_.finishTimeout),
        hang_(options_.hangTimeoutAuto ? HangDetector(HangCalibrationRules{}) : HangDetector(options_.hangTimeout)),
        hangTimer_(io), progress_(options_.stopWithoutProgress), healthTimer_(io), finishTimer_(io), dumpTimer_(io),
        recovery_(options_.recovery == AgentOptions::Recovery::kInProcess),
        spares_(io, supervisor, specs_, options_.heartbeats.get(), options_.nprocPerNode,
                recovery_.enabled() ? options_.sparesPerNode : 0, options_.warmStartAfter) {
    if (!options_.stdoutConsole) options_.stdoutConsole = std::make_shared<ConsoleWriter>(ConsoleWriterOptions{1});
    if (!options_.stderrConsole) options_.stderrConsole = std::make_shared<ConsoleWriter>(ConsoleWriterOptions{2});
    if (!options_.canDumpStack) options_.canDumpStack = isPythonProcess;
    if (!options_.clock) options_.clock = [] { return std::chrono::steady_clock::now(); };
  }

  void start(ElasticAgent* self, std::function<void(int)> onFinished) {
    onFinished_ = std::move(onFinished);
    if (options_.heartbeats) options_.heartbeats->setOnBeat([this](const HeartbeatMessage& beat) { onBeat(beat); });
    scheduleHangCheck();
    scheduleHealthReport();
    supervisor_.setExitHandler([this](const ProcessExit& exit) {
      if (group_ && group_->handleExit(exit)) return;
      if (spares_.handleExit(exit)) return;
      spdlog::debug("exit of pid {} belongs to no running worker", exit.pid);
    });
    emit(agentEvent(AgentEvent::Kind::kJoining, 0));
    // A node that waits long for its first round (a standby) readies its ranks' processes meanwhile.
    spares_.waitForFirstRound([this] { return !finished_ && !stopSignal_ && !group_ && !pendingRound_; });
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
      oweStopReport(std::max(attempt_.round.round, stopOwed_.value_or(0)));
    }
    if (!group_ || attempt_.groupStopped) {
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
    if (recovery_.pending && group_ && !attempt_.groupStopped) {
      recoverInProcess(round);
      return;
    }
    pendingRound_ = round;
    maybeStartPendingRound();
  }

  void onRoundInterrupted(uint64_t round, const std::string& reason) {
    const uint64_t known = std::max(attempt_.round.round, pendingRound_ ? pendingRound_->round : 0);
    if (finished_ || round > known) return;  // not a round this node was told of
    // A round interrupted before its workers started here (the last ones were still stopping)
    // never starts.
    if (pendingRound_ && pendingRound_->round <= round) pendingRound_.reset();
    if (round == attempt_.round.round) emit(agentEvent(AgentEvent::Kind::kRoundInterrupted, round, reason));
    if (!recovery_.pending && recovery_.enabled() && group_ && !attempt_.groupStopped &&
        round == attempt_.round.round && !attempt_.firstFailure && attempt_.dumping.empty()) {
      // Another node's failure, a lost node or a joining one: with every local rank live under the
      // API, this node's workers go on into the next round as well (its ranks may move, its world
      // may change); else they stop, and the new round starts fresh ones beside the others' live
      // ones, which take their state from those.
      drainBeats();
      std::string why;
      if (recovery_.eligible(-1, options_.nprocPerNode, [this](int lr) { return group_->running(lr); }, &why)) {
        spdlog::warn("round {} interrupted ({}): recovering in process, the workers here keep running", round, reason);
        recovery_.pending = InProcessRecovery::Carry{std::nullopt, reason};
      } else {
        spdlog::warn("round {} interrupted ({}); in-process recovery is not possible here ({})", round, reason, why);
      }
    }
    if (recovery_.pending && group_ && !attempt_.groupStopped && round == attempt_.round.round) {
      // In-process recovery: the live workers go on into the next round; nothing of this round
      // runs any more but in them, so the hand-over is answered now.
      rendezvous_.reportStopped(round);
      return;
    }
    if (group_ && !attempt_.groupStopped && round == attempt_.round.round && attempt_.dumping.empty()) {
      spdlog::info("round {} interrupted: {}; stopping workers", round, reason);
      group_->stop(SIGTERM, options_.shutdownGrace);
    }
    oweStopReport(round);
    settleStopReport();
  }

  // Fencing (docs/rendezvous.md): the server may form a round without this node soon, so the
  // workers get a short grace, not the shutdown grace.
  void onFenced(uint64_t round, const std::string& reason, std::chrono::milliseconds killWithin) {
    if (finished_ || !group_ || attempt_.groupStopped || round != attempt_.round.round) return;
    spdlog::warn("round {} fenced ({}): stopping workers, SIGKILL in {}ms", round, reason, killWithin.count());
    emit(agentEvent(AgentEvent::Kind::kFenced, round, reason));
    hang_.disarm();
    if (killWithin.count() <= 0) {
      group_->killNow();
    } else {
      group_->stop(SIGTERM, std::min(killWithin, options_.shutdownGrace));
    }
  }

  void onPeerFinished(uint64_t round, int rank, const std::string& node) {
    if (finished_ || !group_ || attempt_.groupStopped || round != attempt_.round.round) return;
    attempt_.finish.peerFinished(rank, node);
    startFinishTimer();
  }

  void onJobHealth(const JobHealthView& view) {
    if (finished_) return;
    hang_.adoptSections(view.sections);
    for (auto& report : jobStragglers_.update(view)) tellStraggler(std::move(report));
  }

  void onJobClosed(const JobClosure& closure) {
    if (finished_ || closure_) return;  // the first closure is the job's
    pendingRound_.reset();
    closure_ = closure;
    // (A hang's stack dumps are awaited first; the group is stopped when they are in.)
    if (closure.outcome == JobOutcome::kFailed && group_ && !attempt_.groupStopped && attempt_.dumping.empty()) {
      group_->stop(SIGTERM, options_.shutdownGrace);
    }
    maybeFinishClosedJob();
  }

 private:
  void maybeStartPendingRound() {
    if (finished_ || closure_ || !pendingRound_ || (group_ && !attempt_.groupStopped)) return;
    RoundInfo round = *pendingRound_;
    pendingRound_.reset();
    if (round.restartCount > 0) {
      spdlog::warn("restarting workers: attempt {} of {} (round {})", round.restartCount + 1, options_.maxRestarts + 1,
                   round.round);
    }
    startGroup(round);
  }

  // Where a round's workers find their stores. torch's (MASTER_ADDR:MASTER_PORT): the agent's
  // TorchStore when it serves one; every rank is its client, on this node, and it outlives them
  // all. libddp's (DDPRUN_STORE_ADDR): the job's store that the rendezvous named (several nodes);
  // on one node the agent's TorchStore too, through torch's protocol, so a C++ rank and a torch
  // rank share its keys (worker_sdk/tcp_store.h); with no TorchStore, a folder per round.
  void placeStores(RoundInfo& round) {
    if (options_.torchStore) {
      options_.torchStore->beginRound(options_.runId, round);
      round.masterAddr = TorchStore::kAddress;
      round.masterPort = options_.torchStore->port();
      if (round.storeAddr.empty()) {
        round.storeAddr = "tcpstore://" + joinHostPort(TorchStore::kAddress, round.masterPort);
        round.storePrefix = storePrefix(options_.runId, round.round);
      }
    } else if (round.storeAddr.empty()) {
      specs_.placeFileStore(round);
    }
  }

  void startGroup(RoundInfo round) {
    placeStores(round);
    judgeAttempt(round.restartCount > attempt_.round.restartCount);  // the attempt that ended, if not yet
    finishTimer_.cancel();
    dumpTimer_.cancel();
    attempt_ = Attempt(round, options_.finishTimeout);
    stragglers_.newAttempt();
    std::function<WorkerChannelEnd(int)> channel;
    if (options_.heartbeats) {
      options_.heartbeats->newAttempt(spares_.waitingKeys());
      channel = [this](int localRank) { return options_.heartbeats->openChannel(localRank); };
    }
    std::vector<WorkerSpec> specs = specs_.make(round, channel);
    std::vector<WarmSpares::Contract> contracts;  // for the waiting processes that become ranks
    if (spares_.waiting()) {
      for (const auto& spec : specs) contracts.push_back(WorkerSpecs::spareContract(spec));
    }
    recovery_.reset();  // new processes: none has opted in yet
    recovery_.pending.reset();
    group_.reset();  // the previous attempt's group has stopped and been swept
    WorkerGroupEvents events;
    // A rank that finished beats no more: it is not hung (seed 001: the ranks that finished are
    // not the ones to blame; the ones still waiting are).
    events.onSucceededWorker = [this](const WorkerExit& exit) {
      drainBeats();  // its last beats, queued before it exited, must not bring it back
      hang_.forget(exit.rank);
      onRankFinished(exit);
    };
    events.onFirstFailure = [this](const WorkerExit& exit) { onWorkerFailed(exit); };
    events.onSucceeded = [this] { onGroupSucceeded(); };
    events.onStopped = [this] { onGroupStopped(); };
    group_ = std::make_unique<WorkerGroup>(io_, supervisor_, std::move(specs), std::move(events));
    hang_.arm();
    emit(roundFormedEvent(round));
    spares_.startGroup(*group_, round, contracts);
    if (options_.torchStore) options_.torchStore->admit(group_->pids());
    for (int localRank = 0; localRank < options_.nprocPerNode; ++localRank) {
      WorkerExit w;
      w.localRank = localRank;
      w.rank = round.rankOffset + localRank;
      w.pid = group_->pid(localRank);
      emit(workerEvent(AgentEvent::Kind::kWorkerStarted, round.round, w));
    }
  }

  // The next round of an in-process recovery: the failed worker is started again in it, the
  // others are told it on their channels and keep their processes (DESIGN.md section 11).
  void recoverInProcess(RoundInfo round) {
    const InProcessRecovery::Carry carry = *recovery_.pending;
    recovery_.pending.reset();
    if (!carry.failed) {
      carryIntoRound(round, carry.reason);
      return;
    }
    const WorkerExit failed = *carry.failed;
    // A second failure before the next round: the group reports no second first failure until the
    // failed worker is replaced, so it is seen here. The recovery fails; every rank restarts.
    for (int lr = 0; lr < options_.nprocPerNode; ++lr) {
      if (lr != failed.localRank && !group_->running(lr)) {
        spdlog::warn("local rank {} ended during the in-process recovery: restarting every rank", lr);
        group_->stop(SIGTERM, options_.shutdownGrace);
        pendingRound_ = round;
        return;
      }
    }
    placeStores(round);
    const bool warm = group_->spares() > 0;
    std::function<WorkerChannelEnd(int)> channel;
    if (options_.heartbeats && !warm) {
      channel = [this, &failed](int lr) {
        return lr == failed.localRank ? options_.heartbeats->reopenChannel(lr) : WorkerChannelEnd{};
      };
    }
    std::vector<WorkerSpec> specs = specs_.make(round, channel);
    finishTimer_.cancel();
    dumpTimer_.cancel();
    attempt_ = Attempt(round, options_.finishTimeout);
    group_->renumber(round.rankOffset);
    WorkerSpec& spec = specs[static_cast<std::size_t>(failed.localRank)];
    pid_t sparePid = 0;
    const auto contract = WorkerSpecs::spareContract(spec);
    if (warm) {
      // The oldest spare becomes the rank (told below); a new spare starts behind it.
      sparePid = group_->promoteSpare(failed.localRank, std::move(spec));
      spares_.add(*group_, round);
    } else {
      group_->replace(failed.localRank, std::move(spec));
      if (options_.heartbeats) options_.heartbeats->workerSpawned(failed.localRank);
    }
    if (options_.torchStore) options_.torchStore->admit(group_->pids());
    recovery_.recovered(hang_.bestStep().value_or(-1));
    hang_.arm();
    emit(roundFormedEvent(round));
    WorkerExit started;
    started.localRank = failed.localRank;
    started.rank = round.rankOffset + failed.localRank;
    started.pid = group_->pid(failed.localRank);
    emit(workerEvent(AgentEvent::Kind::kWorkerStarted, round.round, started));
    const std::string reason = "rank " + std::to_string(failed.rank) +
                               (failed.signal ? " was killed by " + signalName(failed.signal)
                                              : " exited with " + std::to_string(failed.exitCode));
    int told = 0;
    for (int lr = 0; lr < options_.nprocPerNode; ++lr) {
      if (!options_.heartbeats) continue;
      if (lr == failed.localRank) {
        if (sparePid > 0) {
          spares_.tell(round, lr, sparePid, contract, "a spare takes the place of rank " + std::to_string(failed.rank));
        }
        continue;
      }
      if (options_.heartbeats->sendToWorker(lr, InProcessRecovery::notice(round, lr, reason))) ++told;
    }
    spdlog::warn("recovered in process: rank {} {} pid {}, {} live rank(s) told round {} (restart {} of {})",
                 started.rank, sparePid == 0 ? "started again as" : "taken over by the spare", started.pid, told,
                 round.round, round.restartCount, options_.maxRestarts);
  }

  // The next round of another node's recovery (or of a membership change): every local rank lives
  // on and is told its place in it; none is started.
  void carryIntoRound(RoundInfo round, const std::string& reason) {
    for (int lr = 0; lr < options_.nprocPerNode; ++lr) {
      if (!group_->running(lr)) {
        // Ended while the round formed: no first failure was reported for it (a group reports one
        // only while it runs, and this one still does), so every rank here restarts in the round.
        spdlog::warn("local rank {} ended during the in-process recovery: restarting every rank here", lr);
        group_->stop(SIGTERM, options_.shutdownGrace);
        pendingRound_ = round;
        return;
      }
    }
    placeStores(round);
    finishTimer_.cancel();
    dumpTimer_.cancel();
    attempt_ = Attempt(round, options_.finishTimeout);
    group_->renumber(round.rankOffset);
    if (options_.torchStore) options_.torchStore->admit(group_->pids());
    recovery_.recovered(hang_.bestStep().value_or(-1));
    hang_.arm();
    emit(roundFormedEvent(round));
    int told = 0;
    for (int lr = 0; lr < options_.nprocPerNode; ++lr) {
      if (options_.heartbeats && options_.heartbeats->sendToWorker(lr, InProcessRecovery::notice(round, lr, reason))) {
        ++told;
      }
    }
    spdlog::warn("recovered in process: {} live rank(s) here told round {} (ranks {}-{} of {}, restart {} of {})", told,
                 round.round, round.rankOffset, round.rankOffset + options_.nprocPerNode - 1, round.worldSize,
                 round.restartCount, options_.maxRestarts);
  }

  void onHung(const HungRank& hung) {
    if (!group_ || attempt_.groupStopped || attempt_.firstFailure || stopSignal_) return;
    int localRank = hung.rank - attempt_.round.rankOffset;
    if (localRank < 0 || localRank >= options_.nprocPerNode || !group_->running(localRank)) return;
    WorkerExit exit;
    exit.localRank = localRank;
    exit.rank = hung.rank;
    exit.pid = group_->pid(localRank);
    exit.time = std::chrono::system_clock::now();
    exit.hangNote = "no heartbeat for " + fmt::format("{:.3f}", hung.silentFor.count() / 1000.0) +
                    "s after step " + std::to_string(hung.lastStep) +
                    (hung.section.empty() ? "" : ", in section '" + hung.section + "'") +
                    (hung.calibrated ? " (bound " + formatSeconds(hung.bound) + ", learned by --hang_timeout=auto)"
                                     : "");
    spdlog::warn("rank {} is silent ({})", hung.rank, exit.hangNote);
    std::string why;
    if (recovery_.enabled() && !recovery_.pending &&
        recovery_.eligible(localRank, options_.nprocPerNode, [this](int lr) { return group_->running(lr); }, &why)) {
      // In-process recovery: the hung rank is ended now (its exit is the failure that is
      // recovered); the others' collectives with it fail on its closed connections.
      spdlog::warn("ending hung rank {} (pid {}) for an in-process recovery", hung.rank, exit.pid);
      hang_.forget(hung.rank);
      supervisor_.signalGroup(exit.pid, SIGKILL);
      return;
    }
    diagnoseAndStop(exit);
  }

  // --- heartbeats (docs/heartbeat.md) -----------------------------------------------------------

  void onBeat(const HeartbeatMessage& beat) {
    recovery_.observedStep(beat.step);
    if (beat.recoverable && group_) {
      const int localRank = beat.rank - attempt_.round.rankOffset;
      if (localRank >= 0 && localRank < options_.nprocPerNode) {
        recovery_.optedIn(localRank);
        if (beat.failed && recovery_.enabled() && !recovery_.pending && !attempt_.firstFailure &&
            !attempt_.groupStopped && group_->running(localRank)) {
          // Its own exception (python/ddprun/recovery.py): ended now, its exit is the failure that
          // is recovered. While a recovery is under way, a rank's exception is its peer's failure.
          spdlog::warn("rank {} raised under ddprun.recovery: ending it (pid {}) for an in-process recovery", beat.rank,
                       group_->pid(localRank));
          supervisor_.signalGroup(group_->pid(localRank), SIGKILL);
        }
      }
    }
    // Only a live rank of the armed attempt counts for stragglers.
    if (!hang_.observe(beat, options_.clock()) || !beat.stepSeconds) return;
    for (auto& o : options_.observers) o->onStep(beat.rank - attempt_.round.rankOffset, *beat.stepSeconds);
    onStepTime(beat.rank, *beat.stepSeconds);
  }

  // Before a decision on the latest beats.
  void drainBeats() {
    if (options_.heartbeats) options_.heartbeats->drain();
  }

  void scheduleHangCheck() {
    const auto period = hang_.checkPeriod();
    if (period.count() <= 0) return;  // listening only
    hangTimer_.expires_after(period);
    hangTimer_.async_wait([this](const boost::system::error_code& ec) {
      if (ec || finished_) return;
      if (auto hung = hang_.check(options_.clock())) onHung(*hung);
      scheduleHangCheck();
    });
  }

  // --- stragglers (agent/straggler_detector.h) -------------------------------------------------

  void onStepTime(int rank, double seconds) {
    for (const auto& change : stragglers_.observe(rank, seconds, std::chrono::steady_clock::now())) {
      tellStraggler(describeStraggler(change));
    }
  }

  void tellStraggler(StragglerReport report) {
    spdlog::warn("{}", report.line);
    AgentEvent e = agentEvent(AgentEvent::Kind::kStraggler, attempt_.round.round, std::move(report.reason));
    e.rank = report.rank;
    e.seconds = report.seconds;
    e.back = report.back;
    emit(std::move(e));
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
      health.sections = hang_.learnedSections();
      if (!health.stepSeconds.empty() || !health.sections.empty()) rendezvous_.reportHealth(health);
      scheduleHealthReport();
    });
  }

  // --- --finish_timeout ---------------------------------------------------------------------

  void onRankFinished(const WorkerExit& exit) {
    emit(workerEvent(AgentEvent::Kind::kWorkerSucceeded, attempt_.round.round, exit));
    if (attempt_.finish.rankFinished(exit.rank)) rendezvous_.reportRankFinished(attempt_.round.round, exit.rank);
    startFinishTimer();
  }

  void startFinishTimer() {
    if (!group_ || attempt_.groupStopped || !attempt_.finish.start(options_.clock())) return;
    scheduleFinishCheck(attempt_.finish.bound());
  }

  void scheduleFinishCheck(std::chrono::milliseconds after) {
    const uint64_t round = attempt_.round.round;
    finishTimer_.expires_after(after);
    finishTimer_.async_wait([this, round](const boost::system::error_code& ec) {
      if (!ec && round == attempt_.round.round) checkFinish();
    });
  }

  // The bound has passed since the first rank finished (agent/finish_timeout.h).
  void checkFinish() {
    if (finished_ || !group_ || attempt_.groupStopped || attempt_.firstFailure || stopSignal_) return;
    drainBeats();
    const auto now = options_.clock();
    std::vector<FinishTimeout::Running> running;
    for (int localRank = 0; localRank < options_.nprocPerNode; ++localRank) {
      if (!group_->running(localRank)) continue;
      const int rank = attempt_.round.rankOffset + localRank;
      running.push_back(FinishTimeout::Running{localRank, rank, hang_.silentFor(rank, now)});
    }
    FinishTimeout::Verdict verdict = attempt_.finish.check(running, now);
    if (verdict.hung.empty()) {
      if (!group_->allExited()) scheduleFinishCheck(std::max(verdict.nextCheck, std::chrono::milliseconds(10)));
      return;
    }
    attempt_.diagnosis = std::move(verdict.diagnosis);
    WorkerExit exit;
    exit.localRank = verdict.hung.front();
    exit.rank = attempt_.round.rankOffset + verdict.hung.front();
    exit.pid = group_->pid(verdict.hung.front());
    exit.time = std::chrono::system_clock::now();
    exit.hangNote = std::move(verdict.hangNote);
    diagnoseAndStop(exit);
  }

  // --- evidence before the kill (agent/hang_evidence.h) -------------------------------------

  // A hang was declared (`exit` is the rank blamed): tell the rendezvous, take the Python stack of
  // every rank still running here, wait for the dumps at most stackDumpWait, then stop the group
  // as for any failure.
  void diagnoseAndStop(WorkerExit exit) {
    exit = blameFromFlightRecorders(*group_, attempt_, options_.nprocPerNode, std::move(exit));
    attempt_.firstFailure = exit;
    group_->markFailed();
    hang_.disarm();
    finishTimer_.cancel();
    const std::string how = "is hung (" + exit.hangNote + ")";
    spdlog::warn("worker rank {} (local_rank {}, pid {}) {}; taking the stacks of the running ranks", exit.rank,
                 exit.localRank, exit.pid, how);
    emit(workerEvent(AgentEvent::Kind::kHang, attempt_.round.round, exit, exit.hangNote));
    emit(workerEvent(AgentEvent::Kind::kWorkerFailed, attempt_.round.round, exit, how));
    reportFailure(exit, how.substr(0, 200));
    requestStackDumps(*group_, attempt_, options_.nprocPerNode, options_.canDumpStack,
                      std::chrono::steady_clock::now() + options_.stackDumpWait);
    awaitDumps();
  }

  void awaitDumps() {
    if (!stackDumpsPending(*group_, attempt_, std::chrono::steady_clock::now())) {
      collectStackDumps(*group_, attempt_, options_.stackDumpWait);
      group_->stop(SIGTERM, options_.shutdownGrace);
      return;
    }
    dumpTimer_.expires_after(std::chrono::milliseconds(20));
    const uint64_t round = attempt_.round.round;
    dumpTimer_.async_wait([this, round](const boost::system::error_code& ec) {
      if (!ec && round == attempt_.round.round && group_ && !attempt_.groupStopped) awaitDumps();
    });
  }

  void onWorkerFailed(const WorkerExit& exit) {
    if (attempt_.firstFailure) return;  // a hang was declared first; this exit is its stack dump
    if (rendezvous_.fenced(attempt_.round.round)) {
      // Killed by the fence (this agent's or the watchdog's, while this process was frozen), or
      // ended while the node was cut off: not a failure of the job, and no restart is spent.
      spdlog::warn("worker rank {} (pid {}) of fenced round {} ended; stopping the others", exit.rank, exit.pid,
                   attempt_.round.round);
      hang_.disarm();
      group_->killNow();
      return;
    }
    std::string how = !exit.spawnError.empty() ? "could not be started (" + exit.spawnError + ")"
                      : !exit.hangNote.empty() ? "is hung"
                      : exit.signal      ? "was killed by " + signalName(exit.signal)
                                         : "failed with exit code " + std::to_string(exit.exitCode);
    if (recovery_.enabled() && exit.spawnError.empty()) {
      drainBeats();  // the latest opt-ins
      std::string why;
      if (recovery_.eligible(exit.localRank, options_.nprocPerNode,
                             [this](int lr) { return group_->running(lr); }, &why)) {
        spdlog::warn("worker rank {} (local_rank {}, pid {}) {}; recovering in process: the others keep running",
                     exit.rank, exit.localRank, exit.pid, how);
        recovery_.pending = InProcessRecovery::Carry{exit, {}};
        recovery_.forget(exit.localRank);
        emit(workerEvent(AgentEvent::Kind::kWorkerFailed, attempt_.round.round, exit, how));
        hang_.forget(exit.rank);
        // The rendezvous counts it against the budget and forms the next round (onRoundReady), or
        // ends the job (onJobClosed: the group is stopped as for any failure).
        attempt_.firstFailure = exit;
        reportFailure(exit, how);
        return;
      }
      spdlog::warn("in-process recovery is not possible ({}): restarting every rank", why);
    }
    attempt_.firstFailure = exit;
    hang_.disarm();
    spdlog::warn("worker rank {} (local_rank {}, pid {}) {}; stopping the others", exit.rank, exit.localRank, exit.pid,
                 how);
    emit(workerEvent(AgentEvent::Kind::kWorkerFailed, attempt_.round.round, exit, how));
    // Tell the rendezvous first, so that peers restart while this node is still stopping.
    reportFailure(exit, how);
    group_->stop(SIGTERM, options_.shutdownGrace);
  }

  void reportFailure(const WorkerExit& exit, const std::string& how) {
    WorkerFailure failure{exit.rank, exit.exitCode, exit.signal, exitStatusOf(exit), how};
    judgeAttempt(true);
    if (progress_.stopNow()) {
      failure.attemptsWithoutProgress = progress_.restartsWithoutProgress();
      const std::string note = progress_.why();
      attempt_.diagnosis = attempt_.diagnosis.empty() ? note : attempt_.diagnosis + "\n" + note;
      spdlog::error("{}", note);
    }
    rendezvous_.reportWorkerFailure(attempt_.round.round, failure);
  }

  // --stop_without_progress (agent/progress_judge.h): once per attempt, by its best step.
  void judgeAttempt(bool endsInRestart) {
    if (attempt_.judged || !group_) return;
    attempt_.judged = true;
    drainBeats();
    progress_.judge(hang_.bestStep(), endsInRestart, attempt_.round.restartCount);
  }

  void onGroupSucceeded() {
    attempt_.groupStopped = true;
    group_->killSpares();  // every rank is done: nothing to stand by for
    if (options_.torchStore) options_.torchStore->admit({});
    supervisor_.sweepOrphans(group_->pids());
    rendezvous_.reportSucceeded(attempt_.round.round);
    settleStopReport();
  }

  void onGroupStopped() {
    attempt_.groupStopped = true;
    if (options_.torchStore) options_.torchStore->admit({});
    int swept = supervisor_.sweepOrphans(group_->pids());
    if (swept > 0) spdlog::info("killed {} leftover process(es) of the stopped workers", swept);
    if (attempt_.firstFailure) lastFailure_ = makeReport(*attempt_.firstFailure);
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
    if (!stopOwed_ || closure_ || (group_ && !attempt_.groupStopped)) return;
    rendezvous_.reportStopped(*stopOwed_);
    stopOwed_.reset();
  }

  void maybeFinishClosedJob() {
    if (!closure_ || (group_ && !attempt_.groupStopped)) return;
    const ExitDecision decision = decideExit(*closure_, lastFailure_);
    if (decision.printReport) options_.stderrConsole->write(formatFailureReport(*lastFailure_));
    if (!decision.error.empty()) spdlog::error("{}", decision.error);
    finish(decision.status);
  }

  FailureReportInput makeReport(const WorkerExit& first) {
    return gatherFailureReport(*group_, first, options_.programName, options_.host, attempt_.diagnosis, attempt_.stacks);
  }

  void finish(int status) {
    if (finished_) return;
    finished_ = true;
    healthTimer_.cancel();
    hangTimer_.cancel();
    if (group_ && !group_->allExited()) group_->killNow();
    spares_.stopWaiting();
    AgentEvent ended = agentEvent(AgentEvent::Kind::kJobEnded, attempt_.round.round,
                                  stopSignal_    ? "stopped by " + signalName(*stopSignal_)
                                  : closure_ ? closure_->reason
                                             : std::string());
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
    base.groupRank = attempt_.round.groupRank;
    base.groupWorldSize = attempt_.round.groupWorldSize;
    base.agentRestarts = attempt_.round.restartCount;
    base.totalRunTimeS = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
    options_.stderrConsole->write(formatRunEndEvents(base, group_.get(), options_.nprocPerNode, attempt_.round.worldSize,
                                                     status));
  }

  boost::asio::io_context& io_;
  Rendezvous& rendezvous_;
  ProcessSupervisor& supervisor_;
  AgentOptions options_;
  const WorkerSpecs specs_;  // what each worker starts with, where its files go
  std::function<void(int)> onFinished_;
  // The current attempt.
  std::unique_ptr<WorkerGroup> group_;
  Attempt attempt_;
  std::optional<RoundInfo> pendingRound_;
  std::optional<uint64_t> stopOwed_;  // the round whose interruption awaits reportStopped
  // Across attempts: the policies that judge them.
  HangDetector hang_;  // heartbeats: --hang_timeout, and what the others ask of the beats
  boost::asio::steady_timer hangTimer_;
  ProgressJudge progress_;  // --stop_without_progress
  StragglerDetector stragglers_;
  boost::asio::steady_timer healthTimer_;
  JobStragglers jobStragglers_;  // what the job-wide view said last
  boost::asio::steady_timer finishTimer_;  // --finish_timeout, of the current attempt
  boost::asio::steady_timer dumpTimer_;    // a hang's stack dumps, of the current attempt
  std::optional<FailureReportInput> lastFailure_;
  std::optional<JobClosure> closure_;  // the first closure of the job told
  std::optional<int> stopSignal_;
  InProcessRecovery recovery_;  // --recovery=in_process
  WarmSpares spares_;  // --spares_per_node
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
