#include "agent/posix_process_supervisor.h"

#include <sched.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "agent/job_cgroup.h"
#include "agent/lifeline.h"
#include "agent/proc_tree.h"
#include "agent/worker_spawn.h"
#include "common/error.h"

namespace ddprun {
namespace {

std::string randomHex(int bytes) {
  std::random_device rd;
  std::string out;
  const char* digits = "0123456789abcdef";
  for (int i = 0; i < bytes; ++i) {
    unsigned v = rd() & 0xff;
    out += digits[v >> 4];
    out += digits[v & 0xf];
  }
  return out;
}

}  // namespace

std::string defaultWatchdogPath() {
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "ddprun-watchdog";
  return (self.parent_path() / "ddprun-watchdog").string();
}

class PosixProcessSupervisor::Impl {
 public:
  Impl(boost::asio::io_context& io, PosixProcessSupervisorOptions options)
      : sigchld_(io, SIGCHLD), marker_("DDPRUN_JOB_" + randomHex(8)), spawnMethod_(options.spawnMethod) {
    subreaper_ = ::prctl(PR_SET_CHILD_SUBREAPER, 1) == 0;
    if (!subreaper_) {
      spdlog::warn("cannot become a child subreaper: {}; daemonized grandchildren may escape", std::strerror(errno));
    }
    rlimit limit{};
    haveWorkerFileLimit_ = ::getrlimit(RLIMIT_NOFILE, &limit) == 0;
    workerFileLimit_ = limit;  // what the workers get, whatever the agent raises later
    maxFd_ = (haveWorkerFileLimit_ && limit.rlim_cur != RLIM_INFINITY) ? static_cast<unsigned>(limit.rlim_cur) : 65536;
    std::string why;
    cgroup_ = JobCgroup::create("ddprun-" + marker_.substr(marker_.rfind('_') + 1), &why);
    if (!cgroup_) spdlog::debug("no cgroup of the job ({}): descendants that call setsid and clear the environment may escape", why);
    if (!options.watchdogPath.empty()) {
      lifeline_ = std::make_unique<Lifeline>(options.watchdogPath, marker_, options.temporaryFolder,
                                             cgroup_ ? cgroup_->path() : std::string());
    }
    waitForSigchld();
  }

  ~Impl() {
    sigchld_.cancel();
    handler_ = nullptr;  // its owner may be gone; nobody listens any more
    for (pid_t pid : running_) {
      ::kill(-pid, SIGKILL);
      ::kill(pid, SIGKILL);
    }
    for (pid_t pid : running_) ::waitpid(pid, nullptr, 0);  // SIGKILLed: returns at once
    running_.clear();
    for (pid_t pgid : everSpawnedGroups_) ::kill(-pgid, SIGKILL);
    if (!swept_) killOrphans();
    reapAll();
    cgroup_.reset();  // kills whatever is left in it, waits for it to empty, removes it
    reapAll();
    if (lifeline_) {
      for (pid_t pgid : everSpawnedGroups_) lifeline_->forgetGroup(pgid);
      lifeline_->release();  // everything is gone: the watchdog may exit without its own sweep
    }
  }

  pid_t spawn(const SpawnRequest& request) {
    // Everything the child reads is built here: it may not allocate.
    std::vector<std::string> envStrings;
    envStrings.reserve(request.env.vars().size() + 1);
    for (const auto& [name, value] : request.env.vars()) {
      if (name != marker_) envStrings.push_back(name + "=" + value);
    }
    envStrings.push_back(marker_ + "=1");
    std::vector<char*> envp;
    envp.reserve(envStrings.size() + 1);
    for (auto& entry : envStrings) envp.push_back(entry.data());
    envp.push_back(nullptr);
    std::string path = request.executable;
    std::vector<std::string> argStrings;
    argStrings.reserve(request.args.size() + 1);
    argStrings.push_back(request.executable);
    argStrings.insert(argStrings.end(), request.args.begin(), request.args.end());
    std::vector<char*> argv;
    argv.reserve(argStrings.size() + 1);
    for (auto& arg : argStrings) argv.push_back(arg.data());
    argv.push_back(nullptr);

    WorkerSpawnSpec spec;
    spec.path = path.c_str();
    spec.argv = argv.data();
    spec.envp = envp.data();
    spec.stdoutFd = request.stdoutFd;
    spec.stderrFd = request.stderrFd;
    spec.inheritFd = request.inheritFd;
    rlimit now{};
    const bool raised = haveWorkerFileLimit_ && ::getrlimit(RLIMIT_NOFILE, &now) == 0 &&
                        (now.rlim_cur != workerFileLimit_.rlim_cur || now.rlim_max != workerFileLimit_.rlim_max);
    spec.maxFd = raised && now.rlim_cur != RLIM_INFINITY ? static_cast<unsigned>(now.rlim_cur) : maxFd_;
    spec.fileLimit = raised ? &workerFileLimit_ : nullptr;
    spec.cgroupDirFd = cgroup_ ? cgroup_->spawnDirFd() : -1;
    spec.cgroupProcsFd = cgroup_ ? cgroup_->procsFd() : -1;
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    for (int cpu : request.cpus) {
      if (cpu >= 0 && cpu < CPU_SETSIZE) CPU_SET(cpu, &cpus);
    }
    spec.cpus = request.cpus.empty() ? nullptr : &cpus;
    const bool refusedBefore = clone3Refused_;
    SpawnResult result = spawnWorker(spec, spawnMethod_, &clone3Refused_);
    if (clone3Refused_ && !refusedBefore) {
      spdlog::debug("clone3 into the job cgroup was refused; workers move in by cgroup.procs (slower)");
    }
    if (result.pid < 0) throw Error("cannot start " + request.executable + ": " + std::strerror(result.error));
    pid_t pid = result.pid;
    running_.insert(pid);
    everSpawnedGroups_.insert(pid);
    swept_ = false;
    if (lifeline_) lifeline_->trackGroup(pid);
    return pid;
  }

  void signalGroup(pid_t pid, int sig) {
    if (!running_.count(pid) && !everSpawnedGroups_.count(pid)) return;
    if (::kill(-pid, sig) != 0 && errno == ESRCH && running_.count(pid)) {
      ::kill(pid, sig);  // it left its own group: reach it directly
    }
  }

  void signalProcess(pid_t pid, int sig) {
    if (running_.count(pid)) ::kill(pid, sig);  // not yet reaped: the pid is still ours
  }

  void setExitHandler(ExitHandler handler) { handler_ = std::move(handler); }

  int sweepOrphans(const std::vector<pid_t>& endedGroups) {
    for (pid_t pgid : endedGroups) {
      if (!running_.count(pgid)) ::kill(-pgid, SIGKILL);
    }
    // No worker runs: whatever is left in the job's cgroup escaped its group and its marker.
    if (cgroup_ && running_.empty()) cgroup_->kill();
    int killed = killOrphans();
    swept_ = running_.empty();
    for (pid_t pgid : endedGroups) {
      if (running_.count(pgid)) continue;
      everSpawnedGroups_.erase(pgid);
      if (lifeline_) lifeline_->forgetGroup(pgid);
    }
    return killed;
  }

  const std::string& marker() const { return marker_; }
  void setFenceDeadline(std::chrono::steady_clock::time_point deadline) {
    if (lifeline_) lifeline_->fenceAt(deadline);
  }

 private:
  void waitForSigchld() {
    sigchld_.async_wait([this](const boost::system::error_code& ec, int) {
      if (ec) return;
      reapAll();
      waitForSigchld();
    });
  }

  // Reaps every child that ended: workers go to the handler; orphans that came back to us as the
  // subreaper (and the watchdog) are reaped silently so they never linger as zombies.
  void reapAll() {
    while (true) {
      int status = 0;
      pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid <= 0) return;
      if (!running_.erase(pid)) {
        spdlog::debug("reaped orphan {}", pid);
        continue;
      }
      ProcessExit exit;
      exit.pid = pid;
      if (WIFSIGNALED(status)) {
        exit.signal = WTERMSIG(status);
      } else {
        exit.exitCode = WEXITSTATUS(status);
      }
      if (handler_) handler_(exit);
    }
  }

  // Kills living descendants (other than running workers and the watchdog) until none is left;
  // bounded to one second. As a subreaper the agent gets every orphan of its tree back, so its
  // own tree (children files) finds them all; the scan of every process's parent and environment
  // is needed only when that failed. With 1024 agents on one host, scanning all of /proc in
  // every agent took 23 s to stop them.
  int killOrphans() {
    int killed = 0;
    pid_t self = ::getpid();
    pid_t watchdog = lifeline_ ? lifeline_->watchdogPid() : -1;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (std::chrono::steady_clock::now() < deadline) {
      std::set<pid_t> victims;
      auto descendants = subreaper_ ? proc::liveDescendantsOf(self) : std::nullopt;
      if (descendants) {
        victims.insert(descendants->begin(), descendants->end());
      } else {
        auto table = proc::listProcesses();
        for (pid_t pid : proc::liveDescendants(self, table)) victims.insert(pid);
        if (!subreaper_) {
          for (pid_t pid : proc::liveProcessesWithMarker(marker_, table)) victims.insert(pid);
        }
      }
      std::erase_if(victims, [&](pid_t pid) { return pid == watchdog || inRunningGroup(pid); });
      if (victims.empty()) break;
      for (pid_t pid : victims) ::kill(pid, SIGKILL);
      killed += static_cast<int>(victims.size());
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return killed;
  }

  bool inRunningGroup(pid_t pid) const {
    if (running_.empty()) return false;
    pid_t pgid = ::getpgid(pid);
    return pgid > 0 && running_.count(pgid);
  }

  boost::asio::signal_set sigchld_;
  std::string marker_;
  SpawnMethod spawnMethod_;
  bool clone3Refused_ = false;  // once refused (seccomp, old kernel), never tried again
  unsigned maxFd_ = 65536;
  bool haveWorkerFileLimit_ = false;
  rlimit workerFileLimit_{};
  bool subreaper_ = false;
  bool swept_ = true;  // no process spawned since the last complete sweep
  std::unique_ptr<JobCgroup> cgroup_;  // before lifeline_: the watchdog is told its path
  std::unique_ptr<Lifeline> lifeline_;
  std::set<pid_t> running_;             // spawned and not reaped yet
  std::set<pid_t> everSpawnedGroups_;   // groups the watchdog knows about
  ExitHandler handler_;
};

PosixProcessSupervisor::PosixProcessSupervisor(boost::asio::io_context& io, PosixProcessSupervisorOptions options)
    : impl_(std::make_unique<Impl>(io, std::move(options))) {}
PosixProcessSupervisor::~PosixProcessSupervisor() = default;
pid_t PosixProcessSupervisor::spawn(const SpawnRequest& request) { return impl_->spawn(request); }
void PosixProcessSupervisor::signalGroup(pid_t pid, int sig) { impl_->signalGroup(pid, sig); }
void PosixProcessSupervisor::signalProcess(pid_t pid, int sig) { impl_->signalProcess(pid, sig); }
void PosixProcessSupervisor::setExitHandler(ExitHandler handler) { impl_->setExitHandler(std::move(handler)); }
int PosixProcessSupervisor::sweepOrphans(const std::vector<pid_t>& endedGroups) {
  return impl_->sweepOrphans(endedGroups);
}
const std::string& PosixProcessSupervisor::marker() const { return impl_->marker(); }
void PosixProcessSupervisor::setFenceDeadline(std::chrono::steady_clock::time_point deadline) {
  impl_->setFenceDeadline(deadline);
}

}  // namespace ddprun
