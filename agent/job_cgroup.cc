#include "agent/job_cgroup.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "agent/cgroup_sweep.h"
#include "common/strings.h"

namespace ddprun {
namespace {

// Where cgroup v2 is mounted (/sys/fs/cgroup, or /sys/fs/cgroup/unified on a hybrid system).
std::string cgroup2Mount() {
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    auto sep = line.find(" - ");
    if (sep == std::string::npos || line.compare(sep + 3, 8, "cgroup2 ") != 0) continue;
    auto fields = split(line.substr(0, sep), ' ');
    if (fields.size() > 4) return fields[4];
  }
  return {};
}

// This process's cgroup v2 path ("0::/some/path").
std::string ownCgroup() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    if (startsWith(line, "0::")) return line.substr(3);
  }
  return {};
}

bool writeFile(const std::string& path, std::string_view text) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  return fd && ::write(fd.get(), text.data(), text.size()) == static_cast<ssize_t>(text.size());
}

}  // namespace

std::unique_ptr<JobCgroup> JobCgroup::create(const std::string& name, std::string* why) {
  const std::string mount = cgroup2Mount();
  if (mount.empty()) {
    *why = "no cgroup v2 mount";
    return nullptr;
  }
  std::string own = ownCgroup();
  if (own.empty() || own == "/") own.clear();
  const std::string path = mount + own + "/" + name;
  // Owned from the start (agent/cgroup_sweep.h): another agent's watchdog may sweep stale job
  // cgroups beside this one, and removes one only while nobody holds it.
  UniqueFd dir;
  for (int attempt = 0; !dir && attempt < 3; ++attempt) {
    if (::mkdir(path.c_str(), 0755) != 0) {
      *why = "cannot create " + path + ": " + std::strerror(errno);
      return nullptr;
    }
    dir = UniqueFd(cgroup::ownJobCgroup(path));
    if (!dir) ::rmdir(path.c_str());  // gone already when a sweep took it first; else not ours to keep
  }
  struct stat st {};
  UniqueFd procs(::open((path + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC));
  if (::stat((path + "/cgroup.kill").c_str(), &st) != 0 || !procs || !dir) {
    *why = ::stat((path + "/cgroup.kill").c_str(), &st) != 0 ? "no cgroup.kill (Linux 5.14 or later)"
                                                              : "cannot open " + path + (dir ? "/cgroup.procs" : "");
    ::rmdir(path.c_str());
    return nullptr;
  }
  return std::unique_ptr<JobCgroup>(new JobCgroup(path, std::move(dir), std::move(procs)));
}

JobCgroup::~JobCgroup() {
  kill();
  // Killed processes leave the cgroup once the kernel has torn them down (zombies do not count).
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (!empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  for (const auto& leaf : leaves_) ::rmdir(leaf.c_str());
  ::rmdir(path_.c_str());
}

int JobCgroup::spawnDirFd() {
  if (!killed_) return leafDir_ ? leafDir_.get() : dir_.get();
  // Leaves of earlier attempts are empty by now unless a process still dies: removed if they can be.
  std::erase_if(leaves_, [](const std::string& leaf) { return ::rmdir(leaf.c_str()) == 0; });
  std::string leaf = path_ + "/w" + std::to_string(++generation_);
  leafDir_ = UniqueFd();
  if (::mkdir(leaf.c_str(), 0755) != 0) return -1;
  leaves_.push_back(leaf);
  leafDir_ = UniqueFd(::open(leaf.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  killed_ = false;
  return leafDir_ ? leafDir_.get() : -1;
}

void JobCgroup::kill() {
  writeFile(path_ + "/cgroup.kill", "1");
  killed_ = true;
}

bool JobCgroup::empty() const {
  std::ifstream in(path_ + "/cgroup.events");
  std::string line;
  while (std::getline(in, line)) {
    if (startsWith(line, "populated ")) return line == "populated 0";
  }
  return true;  // gone already
}

}  // namespace ddprun
