#include "agent/proc_tree.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <map>

namespace ddprun::proc {
namespace {

// Reads a small /proc file whole; empty on any error (the process may be gone already).
std::string readProcFile(const std::string& path) {
  std::string data;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return data;
  char buf[4096];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    data.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return data;
}

bool parseStat(pid_t pid, ProcessInfo* info) {
  std::string stat = readProcFile("/proc/" + std::to_string(pid) + "/stat");
  // "pid (comm) S ppid ...": comm may hold spaces and parentheses, so parse after the last ')'.
  size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 4 > stat.size()) return false;
  info->pid = pid;
  info->state = stat[close + 2];
  info->parent = static_cast<pid_t>(std::strtol(stat.c_str() + close + 4, nullptr, 10));
  return true;
}

}  // namespace

std::vector<ProcessInfo> listProcesses() {
  std::vector<ProcessInfo> table;
  DIR* dir = ::opendir("/proc");
  if (!dir) return table;
  while (dirent* entry = ::readdir(dir)) {
    char* end = nullptr;
    long pid = std::strtol(entry->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    ProcessInfo info;
    if (parseStat(static_cast<pid_t>(pid), &info)) table.push_back(info);
  }
  ::closedir(dir);
  return table;
}

std::vector<pid_t> liveDescendants(pid_t root, const std::vector<ProcessInfo>& table) {
  std::multimap<pid_t, const ProcessInfo*> children;
  for (const auto& p : table) children.emplace(p.parent, &p);
  std::vector<pid_t> result;
  std::vector<pid_t> frontier{root};
  while (!frontier.empty()) {
    pid_t parent = frontier.back();
    frontier.pop_back();
    auto [begin, end] = children.equal_range(parent);
    for (auto it = begin; it != end; ++it) {
      const ProcessInfo* child = it->second;
      if (child->pid == root) continue;
      if (child->state != 'Z') result.push_back(child->pid);
      frontier.push_back(child->pid);
    }
  }
  return result;
}

std::optional<std::vector<pid_t>> liveDescendantsOf(pid_t root) {
  std::vector<pid_t> result;
  std::vector<pid_t> frontier{root};
  while (!frontier.empty()) {
    pid_t parent = frontier.back();
    frontier.pop_back();
    const std::string taskDir = "/proc/" + std::to_string(parent) + "/task";
    DIR* dir = ::opendir(taskDir.c_str());
    if (!dir) {
      if (parent == root) return std::nullopt;
      continue;  // it ended meanwhile; its children went to the subreaper, found on the next pass
    }
    bool sawChildrenFile = false;
    while (dirent* entry = ::readdir(dir)) {
      if (entry->d_name[0] == '.') continue;
      const std::string path = taskDir + "/" + entry->d_name + "/children";
      if (::access(path.c_str(), R_OK) != 0) continue;
      sawChildrenFile = true;
      const std::string children = readProcFile(path);  // "pid pid ... "
      const char* p = children.c_str();
      while (*p) {
        char* end = nullptr;
        long pid = std::strtol(p, &end, 10);
        if (end == p) break;
        p = end;
        ProcessInfo info;
        if (pid <= 0 || pid == root || !parseStat(static_cast<pid_t>(pid), &info)) continue;
        if (info.state != 'Z') result.push_back(info.pid);
        frontier.push_back(info.pid);
      }
    }
    ::closedir(dir);
    if (parent == root && !sawChildrenFile) return std::nullopt;
  }
  return result;
}

std::vector<pid_t> liveProcessesWithMarker(const std::string& marker, const std::vector<ProcessInfo>& table) {
  std::vector<pid_t> result;
  const std::string needle = marker + "=";
  pid_t self = ::getpid();
  for (const auto& p : table) {
    if (p.state == 'Z' || p.pid == self) continue;
    std::string environ = readProcFile("/proc/" + std::to_string(p.pid) + "/environ");
    // Entries are NUL-separated; a match must start an entry.
    size_t pos = 0;
    while ((pos = environ.find(needle, pos)) != std::string::npos) {
      if (pos == 0 || environ[pos - 1] == '\0') {
        result.push_back(p.pid);
        break;
      }
      pos += needle.size();
    }
  }
  return result;
}

}  // namespace ddprun::proc
