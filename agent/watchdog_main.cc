// ddprun-watchdog: the agent's lifeline. The agent starts it with the read end of a pipe as fd 3 and
// tells it, one line each, which worker process groups exist ("+PGID") and which are gone ("-PGID").
// When the pipe reaches end-of-file the agent is gone, however it died (kill -9 included), so the
// watchdog kills every group it still knows and then every process that carries the agent's marker
// variable in its environment (grandchildren that left their group or daemonized), and exits.
// "bye" means the agent cleaned up itself: the watchdog exits without a sweep.
// "fNS" (fencing, docs/rendezvous.md): unless another "f" line comes first, at CLOCK_MONOTONIC time
// NS every worker is killed (groups, cgroup, marked processes) while the watchdog keeps watching:
// a frozen agent cannot fence its workers, this separate process can.
// It is a separate small program so that it costs little memory and shares no state with the agent.
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <thread>

#include "agent/cgroup_sweep.h"
#include "agent/proc_tree.h"
#include "ddprun_build_info.h"  // generated: cmake/WriteBuildInfo.cmake

namespace {

constexpr int kLifelineFd = 3;

void killMarked(const std::string& marker) {
  // Processes may fork while we kill; repeat until two scans in a row find nothing, bounded in time.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  int emptyScans = 0;
  while (emptyScans < 2 && std::chrono::steady_clock::now() < deadline) {
    auto victims = ddprun::proc::liveProcessesWithMarker(marker, ddprun::proc::listProcesses());
    for (pid_t pid : victims) ::kill(pid, SIGKILL);
    emptyScans = victims.empty() ? emptyScans + 1 : 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(victims.empty() ? 2 : 10));
  }
}

int64_t monotonicNs() {
  struct timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

}  // namespace

// Removes the agent's temporary folder (error files, per-round store) after kill -9.
void removeTree(const char* path) {
  ::nftw(path, [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); }, 16,
         FTW_DEPTH | FTW_PHYS);
}

// SIGKILLs every process in the job's cgroup, however it hid.
void killCgroupMembers(const std::string& path) {
  int fd = ::open((path + "/cgroup.kill").c_str(), O_WRONLY | O_CLOEXEC);
  if (fd >= 0) {
    (void)!::write(fd, "1", 1);
    ::close(fd);
  }
}

// Ends the job's cgroup and removes it once empty.
void killCgroup(const std::string& path) {
  killCgroupMembers(path);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (::rmdir(path.c_str()) != 0 && errno == EBUSY && std::chrono::steady_clock::now() < deadline) {
    ddprun::cgroup::removeLeaves(path);
    if (::rmdir(path.c_str()) == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--version") == 0) {
    const char text[] = "ddprun-watchdog " DDPRUN_VERSION_STRING "\ncommit: " DDPRUN_GIT_COMMIT
                        "\nbuild: " DDPRUN_BUILD_TYPE "\nlinks: nothing (a static executable)\n";
    return ::write(1, text, sizeof(text) - 1) == static_cast<ssize_t>(sizeof(text) - 1) ? 0 : 1;
  }
  std::string marker, removeFolder, cgroup;
  bool usage = argc < 3 || argc % 2 == 0;
  for (int i = 1; i + 1 < argc && !usage; i += 2) {
    if (std::strcmp(argv[i], "--marker") == 0) marker = argv[i + 1];
    else if (std::strcmp(argv[i], "--remove") == 0) removeFolder = argv[i + 1];
    else if (std::strcmp(argv[i], "--cgroup") == 0) cgroup = argv[i + 1];
    else usage = true;
  }
  if (usage || marker.empty()) {
    const char msg[] = "ddprun-watchdog is started by ddprun, not by hand\n";
    (void)!::write(2, msg, sizeof(msg) - 1);
    return 2;
  }
  // Terminal and job-control signals are meant for the agent, which forwards them; the watchdog
  // must live until the lifeline closes.
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGTSTP, SIGTTIN, SIGTTOU}) ::signal(sig, SIG_IGN);

  // Job cgroups of agents that died with their watchdogs, beside this job's: nobody else will
  // remove them. Here, not in the agent: off the launch's path.
  if (!cgroup.empty()) ddprun::cgroup::sweepStaleJobCgroups(cgroup);

  std::set<pid_t> groups;
  int64_t fenceAtNs = 0;  // 0: no fence armed
  std::string pending;
  char buf[512];
  while (true) {
    int timeoutMs = -1;
    if (fenceAtNs > 0) {
      int64_t left = fenceAtNs - monotonicNs();
      timeoutMs = left <= 0 ? 0 : static_cast<int>(std::min<int64_t>((left + 999999) / 1000000, 60000));
    }
    struct pollfd pfd = {kLifelineFd, POLLIN, 0};
    int ready = ::poll(&pfd, 1, timeoutMs);
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) {
      if (fenceAtNs > 0 && monotonicNs() >= fenceAtNs) {
        // Fenced: the agent has not heard from the rendezvous in time and did not say so itself.
        for (pid_t pgid : groups) ::kill(-pgid, SIGKILL);
        if (!cgroup.empty()) killCgroupMembers(cgroup);
        killMarked(marker);
        fenceAtNs = 0;
      }
      continue;
    }
    ssize_t n = ::read(kLifelineFd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    pending.append(buf, static_cast<size_t>(n));
    size_t eol;
    while ((eol = pending.find('\n')) != std::string::npos) {
      std::string line = pending.substr(0, eol);
      pending.erase(0, eol + 1);
      if (line == "bye") return 0;  // the agent cleaned up itself and exits normally
      if (line.size() < 2) continue;
      if (line[0] == 'f') {
        int64_t ns = std::strtoll(line.c_str() + 1, nullptr, 10);
        if (ns > 0) fenceAtNs = ns;
        continue;
      }
      pid_t pgid = static_cast<pid_t>(std::strtol(line.c_str() + 1, nullptr, 10));
      if (pgid <= 1) continue;
      if (line[0] == '+') groups.insert(pgid);
      if (line[0] == '-') groups.erase(pgid);
    }
  }
  for (pid_t pgid : groups) ::kill(-pgid, SIGKILL);
  if (!cgroup.empty()) killCgroup(cgroup);
  killMarked(marker);
  if (!removeFolder.empty()) removeTree(removeFolder.c_str());
  return 0;
}
