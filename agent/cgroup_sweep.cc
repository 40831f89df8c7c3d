#include "agent/cgroup_sweep.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

namespace ddprun::cgroup {
namespace {

// Whether cgroup.events says no process is in the cgroup or its descendants.
bool unpopulated(int dirFd) {
  int fd = ::openat(dirFd, "cgroup.events", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[256];
  ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  return std::strstr(buf, "populated 0") != nullptr;
}

}  // namespace

int ownJobCgroup(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -1;
  // Blocking: a sweep holds it only while it checks and removes. Then the directory must still be
  // the one at `path`: a sweep that took the lock first has removed it.
  struct stat opened {}, now {};
  if (::flock(fd, LOCK_EX) != 0 || ::fstat(fd, &opened) != 0 || ::stat(path.c_str(), &now) != 0 ||
      opened.st_ino != now.st_ino || opened.st_dev != now.st_dev) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void removeLeaves(const std::string& path) {
  DIR* dir = ::opendir(path.c_str());
  if (!dir) return;
  while (dirent* entry = ::readdir(dir)) {
    if (entry->d_type == DT_DIR && entry->d_name[0] != '.') ::rmdir((path + "/" + entry->d_name).c_str());
  }
  ::closedir(dir);
}

int sweepStaleJobCgroups(const std::string& jobCgroup) {
  const auto slash = jobCgroup.rfind('/');
  if (slash == std::string::npos || slash == 0) return 0;
  const std::string parent = jobCgroup.substr(0, slash);
  const std::string own = jobCgroup.substr(slash + 1);
  DIR* dir = ::opendir(parent.c_str());
  if (!dir) return 0;
  int removed = 0;
  while (dirent* entry = ::readdir(dir)) {
    if (entry->d_type != DT_DIR || std::strncmp(entry->d_name, "ddprun-", 7) != 0 || own == entry->d_name) continue;
    const std::string path = parent + "/" + entry->d_name;
    int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) continue;
    // Held: a live agent's. Populated: processes still run there; whose they are is not known, and
    // nothing is killed on a guess.
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0 && unpopulated(fd)) {
      removeLeaves(path);
      if (::rmdir(path.c_str()) == 0) ++removed;
    }
    ::close(fd);
  }
  ::closedir(dir);
  return removed;
}

}  // namespace ddprun::cgroup
