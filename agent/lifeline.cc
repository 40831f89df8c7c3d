#include "agent/lifeline.h"

#include <fcntl.h>
#include <spawn.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <vector>
#include <thread>

extern char** environ;

namespace ddprun {

Lifeline::Lifeline(const std::string& watchdogPath, const std::string& marker, const std::string& temporaryFolder,
                   const std::string& cgroup) {
  if (::access(watchdogPath.c_str(), X_OK) != 0) {
    spdlog::warn("{} not found: workers are still stopped on every exit of ddprun except kill -9", watchdogPath);
    return;
  }
  Pipe pipe = makePipe();
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe.read.get(), 3);  // dup2 clears close-on-exec
  for (int fd = 0; fd < 3; ++fd) posix_spawn_file_actions_addopen(&actions, fd, "/dev/null", O_RDWR, 0);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setpgroup(&attr, 0);  // own group: a Ctrl-C for the agent does not reach it
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
  std::vector<std::string> args = {watchdogPath, "--marker", marker};
  if (!temporaryFolder.empty()) {
    args.push_back("--remove");
    args.push_back(temporaryFolder);
  }
  if (!cgroup.empty()) {
    args.push_back("--cgroup");
    args.push_back(cgroup);
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  int rc = ::posix_spawn(&pid, watchdogPath.c_str(), &actions, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    spdlog::warn("cannot start {}: {}; kill -9 of ddprun would leave workers behind", watchdogPath, std::strerror(rc));
    return;
  }
  pid_ = pid;
  pipe_ = std::move(pipe.write);
}

Lifeline::~Lifeline() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!pipe_) return;
    pipe_.reset();
  }
  // The watchdog's final scan takes a few milliseconds; bounded wait, then leave it to init.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    pid_t rc = ::waitpid(pid_, &status, WNOHANG);
    if (rc == pid_ || (rc < 0 && errno == ECHILD)) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void Lifeline::release() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!pipe_) return;
  writeAll(pipe_.get(), "bye\n");
  pipe_.reset();
}

void Lifeline::trackGroup(pid_t pgid) { send("+" + std::to_string(pgid) + "\n"); }
void Lifeline::forgetGroup(pid_t pgid) { send("-" + std::to_string(pgid) + "\n"); }
// steady_clock is CLOCK_MONOTONIC, which the watchdog reads too: one clock for both processes.
void Lifeline::fenceAt(std::chrono::steady_clock::time_point deadline) {
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline.time_since_epoch()).count();
  send("f" + std::to_string(std::max<int64_t>(ns, 1)) + "\n");
}

void Lifeline::send(const std::string& line) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!pipe_) return;
  if (!writeAll(pipe_.get(), line)) {
    spdlog::warn("ddprun-watchdog is gone; kill -9 of ddprun would now leave workers behind");
    pipe_.reset();
  }
}

}  // namespace ddprun
