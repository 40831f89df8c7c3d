#include "agent/worker_group.h"

#include <signal.h>
#include <spdlog/spdlog.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include "common/error.h"

namespace ddprun {

class WorkerGroup::Impl {
 public:
  struct Worker {
    WorkerSpec spec;
    std::unique_ptr<WorkerOutput> output;
    pid_t pid = 0;
    bool exited = false;
  };

  Impl(boost::asio::io_context& io, ProcessSupervisor& supervisor, std::vector<WorkerSpec> specs,
       WorkerGroupEvents events)
      : io_(io), supervisor_(supervisor), events_(std::move(events)), killTimer_(io) {
    for (auto& spec : specs) workers_.push_back(Worker{std::move(spec), nullptr, 0, false});
  }

  ~Impl() {
    killTimer_.cancel();
    for (auto& w : workers_) {
      if (w.output) w.output->close();
    }
  }

  std::vector<pid_t> start(Impl* waiting) {
    std::vector<pid_t> taken;
    for (auto& w : workers_) {
      taken.push_back(waiting && !waiting->spares_.empty() ? adopt(w, waiting->takeOldestSpare()) : 0);
      if (taken.back() == 0) spawn(w);
    }
    if (waiting) {
      for (auto& spare : waiting->spares_) spares_.push_back(std::move(spare));
      waiting->spares_.clear();
    }
    return taken;
  }

  pid_t addSpare(WorkerSpec spec) {
    if (stopping_) return 0;
    Worker w{std::move(spec), nullptr, 0, false};
    std::string error;
    if (!spawnProcess(w, &error)) {
      spdlog::warn("could not start a spare: {}", error);
      return 0;
    }
    spares_.push_back(std::move(w));
    return spares_.back().pid;
  }

  pid_t promoteSpare(int localRank, WorkerSpec spec) {
    if (stopping_) return 0;
    for (auto& w : workers_) {
      if (w.spec.localRank != localRank) continue;
      if (!w.exited || spares_.empty()) return 0;
      if (w.output) w.output->close();
      w.spec = std::move(spec);
      failureReported_ = false;  // the next failure is a new one
      return adopt(w, takeOldestSpare());
    }
    return 0;
  }

  void killSpares() {
    for (auto& s : spares_) {
      if (!s.exited && s.pid > 0) supervisor_.signalGroup(s.pid, SIGKILL);
    }
  }

  std::size_t spares() const { return spares_.size(); }

  bool replace(int localRank, WorkerSpec spec) {
    for (auto& w : workers_) {
      if (w.spec.localRank != localRank) continue;
      if (!w.exited || stopping_) return false;
      if (w.output) w.output->close();
      w = Worker{std::move(spec), nullptr, 0, false};
      failureReported_ = false;  // the next failure is a new one
      spawn(w);
      return true;
    }
    return false;
  }

  void renumber(int rankOffset) {
    for (auto& w : workers_) w.spec.rank = rankOffset + w.spec.localRank;
  }

  bool handleExit(const ProcessExit& processExit) {
    for (auto it = spares_.begin(); it != spares_.end(); ++it) {
      if (it->pid != processExit.pid) continue;
      if (it->output) it->output->close();
      if (!stopping_) {
        spdlog::warn("a spare (pid {}) ended before it was needed ({}): a script that reads RANK or another rank's "
                     "variable when it starts cannot have spares (--spares_per_node)", it->pid,
                     processExit.signal ? "signal " + std::to_string(processExit.signal)
                                        : "exit code " + std::to_string(processExit.exitCode));
      }
      spares_.erase(it);
      if (stopping_) checkStopped();
      return true;
    }
    for (auto& w : workers_) {
      if (w.pid != processExit.pid || w.exited) continue;
      w.exited = true;
      if (w.output) w.output->drain();
      WorkerExit exit;
      exit.localRank = w.spec.localRank;
      exit.rank = w.spec.rank;
      exit.pid = w.pid;
      exit.exitCode = processExit.exitCode;
      exit.signal = processExit.signal;
      recordExit(exit);
      return true;
    }
    return false;
  }

  void stop(int sig, std::chrono::milliseconds grace) {
    if (!stopping_) {
      stopping_ = true;
      for (auto& w : workers_) {
        if (!w.exited && w.pid > 0) supervisor_.signalGroup(w.pid, sig);
      }
      killSpares();  // not ranks: nothing of theirs to save
    }
    if (checkStopped()) return;
    auto deadline = std::chrono::steady_clock::now() + grace;
    if (killTimerArmed_ && deadline >= killDeadline_) return;
    killTimerArmed_ = true;
    killDeadline_ = deadline;
    killTimer_.expires_at(deadline);
    killTimer_.async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      spdlog::warn("workers still running after the grace period: sending SIGKILL");
      killNow();
    });
  }

  void killNow() {
    stopping_ = true;
    for (auto& w : workers_) {
      if (!w.exited && w.pid > 0) supervisor_.signalGroup(w.pid, SIGKILL);
    }
    killSpares();
  }

  void markFailed() { failureReported_ = true; }

  bool signalWorker(int localRank, int sig) {
    for (auto& w : workers_) {
      if (w.spec.localRank != localRank || w.exited || w.pid <= 0) continue;
      supervisor_.signalProcess(w.pid, sig);
      return true;
    }
    return false;
  }

  bool running(int localRank) const {
    for (const auto& w : workers_) {
      if (w.spec.localRank == localRank) return !w.exited && w.pid > 0;
    }
    return false;
  }

  bool allExited() const {
    for (const auto& w : workers_) {
      if (!w.exited) return false;
    }
    return true;
  }

  const std::vector<WorkerExit>& exits() const { return exits_; }

  const Worker& worker(int localRank) const {
    for (const auto& w : workers_) {
      if (w.spec.localRank == localRank) return w;
    }
    throw StateError("no local rank " + std::to_string(localRank));
  }

  std::vector<pid_t> pids() const {
    std::vector<pid_t> out;
    for (const auto& w : workers_) {
      if (w.pid > 0) out.push_back(w.pid);
    }
    for (const auto& s : spares_) {
      if (s.pid > 0) out.push_back(s.pid);
    }
    return out;
  }

 private:
  Worker takeOldestSpare() {
    Worker spare = std::move(spares_.front());
    spares_.erase(spares_.begin());
    return spare;
  }

  // The spare becomes worker `w` (whose spec it takes, but for the request it was started with);
  // its output goes where that worker's goes. Returns its pid.
  pid_t adopt(Worker& w, Worker spare) {
    w.spec.request = spare.spec.request;
    if (spare.output) {
      try {
        spare.output->becomeRank(w.spec.output);
      } catch (const Error& e) {
        spdlog::warn("rank {} (the spare pid {}): its output stays on the console only: {}", w.spec.rank, spare.pid,
                     e.what());
      }
    }
    w.output = std::move(spare.output);
    w.pid = spare.pid;
    w.exited = false;
    return w.pid;
  }

  bool spawnProcess(Worker& w, std::string* error) {
    try {
      w.output = std::make_unique<WorkerOutput>(io_, w.spec.output);
      SpawnRequest request = w.spec.request;
      request.stdoutFd = w.output->stdoutWriteFd();
      request.stderrFd = w.output->stderrWriteFd();
      w.pid = supervisor_.spawn(request);
      w.output->closeWriteEnds();
      w.output->start();
      spdlog::debug("started local rank {} (rank {}) as pid {}", w.spec.localRank, w.spec.rank, w.pid);
      return true;
    } catch (const Error& e) {
      if (w.output) w.output->close();
      w.exited = true;
      *error = e.what();
      return false;
    }
  }

  void spawn(Worker& w) {
    std::string error;
    if (spawnProcess(w, &error)) return;
    // Counts as a failed worker; reported from the event loop like any other exit.
    WorkerExit exit;
    exit.localRank = w.spec.localRank;
    exit.rank = w.spec.rank;
    exit.exitCode = 127;
    exit.spawnError = error;
    boost::asio::post(io_, [this, exit] { recordExit(exit); });
  }

  void recordExit(WorkerExit exit) {
    exit.time = std::chrono::system_clock::now();
    exits_.push_back(exit);
    if (exit.succeeded() && events_.onSucceededWorker) events_.onSucceededWorker(exit);
    if (!exit.succeeded() && !stopping_ && !failureReported_) {
      failureReported_ = true;
      if (events_.onFirstFailure) events_.onFirstFailure(exit);
    }
    if (stopping_) {
      checkStopped();
      return;
    }
    if (allExited() && !failureReported_ && events_.onSucceeded) events_.onSucceeded();
  }

  // Fires onStopped exactly once, when stopping and every worker is gone.
  bool checkStopped() {
    if (!stopping_ || !allExited() || !spares_.empty()) return false;
    if (!stoppedReported_) {
      stoppedReported_ = true;
      killTimer_.cancel();
      if (events_.onStopped) boost::asio::post(io_, events_.onStopped);
    }
    return true;
  }

  boost::asio::io_context& io_;
  ProcessSupervisor& supervisor_;
  WorkerGroupEvents events_;
  std::vector<Worker> workers_;
  std::vector<Worker> spares_;  // warm spares (in-process recovery): running, not ranks, oldest first
  std::vector<WorkerExit> exits_;
  boost::asio::steady_timer killTimer_;
  std::chrono::steady_clock::time_point killDeadline_;
  bool killTimerArmed_ = false;
  bool stopping_ = false;
  bool failureReported_ = false;
  bool stoppedReported_ = false;
};

WorkerGroup::WorkerGroup(boost::asio::io_context& io, ProcessSupervisor& supervisor, std::vector<WorkerSpec> workers,
                         WorkerGroupEvents events)
    : impl_(std::make_unique<Impl>(io, supervisor, std::move(workers), std::move(events))) {}
WorkerGroup::~WorkerGroup() = default;
void WorkerGroup::start() { impl_->start(nullptr); }
std::vector<pid_t> WorkerGroup::startWithSpares(WorkerGroup& waiting) { return impl_->start(waiting.impl_.get()); }
bool WorkerGroup::replace(int localRank, WorkerSpec spec) { return impl_->replace(localRank, std::move(spec)); }
pid_t WorkerGroup::addSpare(WorkerSpec spec) { return impl_->addSpare(std::move(spec)); }
pid_t WorkerGroup::promoteSpare(int localRank, WorkerSpec spec) { return impl_->promoteSpare(localRank, std::move(spec)); }
void WorkerGroup::renumber(int rankOffset) { impl_->renumber(rankOffset); }
void WorkerGroup::killSpares() { impl_->killSpares(); }
std::size_t WorkerGroup::spares() const { return impl_->spares(); }
bool WorkerGroup::handleExit(const ProcessExit& exit) { return impl_->handleExit(exit); }
void WorkerGroup::stop(int sig, std::chrono::milliseconds grace) { impl_->stop(sig, grace); }
void WorkerGroup::killNow() { impl_->killNow(); }
void WorkerGroup::markFailed() { impl_->markFailed(); }
bool WorkerGroup::signalWorker(int localRank, int sig) { return impl_->signalWorker(localRank, sig); }
bool WorkerGroup::running(int localRank) const { return impl_->running(localRank); }
pid_t WorkerGroup::pid(int localRank) const { return impl_->worker(localRank).pid; }
void WorkerGroup::drainOutput(int localRank) {
  const auto& w = impl_->worker(localRank);
  if (w.output) w.output->drain();
}
bool WorkerGroup::allExited() const { return impl_->allExited(); }
const std::vector<WorkerExit>& WorkerGroup::exits() const { return impl_->exits(); }
std::vector<std::string> WorkerGroup::stderrTail(int localRank) const {
  const auto& w = impl_->worker(localRank);
  return w.output ? w.output->stderrTail() : std::vector<std::string>{};
}
const WorkerSpec& WorkerGroup::spec(int localRank) const { return impl_->worker(localRank).spec; }
std::vector<pid_t> WorkerGroup::pids() const { return impl_->pids(); }

}  // namespace ddprun
