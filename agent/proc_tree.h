// Reading the process table from /proc: who descends from whom, and who carries a marker in its
// environment. Used by the agent to sweep orphans and by ddprun-watchdog after the agent died, so
// it depends on nothing but libc and the standard library.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace ddprun::proc {

struct ProcessInfo {
  pid_t pid = 0;
  pid_t parent = 0;
  char state = '?';  // 'Z' for a zombie, which is already dead and only waits to be reaped
};

std::vector<ProcessInfo> listProcesses();

// Living (non-zombie) processes below root in the parent tree, root itself excluded.
std::vector<pid_t> liveDescendants(pid_t root, const std::vector<ProcessInfo>& table);

// Living processes below root, found through /proc/<pid>/task/<tid>/children: costs a few reads
// per descendant instead of one per process of the machine. nullopt when the kernel has no
// children files (CONFIG_PROC_CHILDREN off); use listProcesses() and liveDescendants() then.
std::optional<std::vector<pid_t>> liveDescendantsOf(pid_t root);

// Living processes whose environment holds a variable named `marker`. Processes of other users
// cannot be read and are skipped.
std::vector<pid_t> liveProcessesWithMarker(const std::string& marker, const std::vector<ProcessInfo>& table);

}  // namespace ddprun::proc
