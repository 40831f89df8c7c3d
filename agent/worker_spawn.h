// Starting one worker process: the system calls between "the agent decides" and "the worker's
// first instruction", behind one function so that PosixProcessSupervisor stays about policy.
//
// Why not posix_spawn or Boost.Process: a worker must start inside the job's cgroup (so that
// cgroup.kill reaches everything it ever starts). Moving a process in by writing cgroup.procs
// takes the kernel's cgroup_threadgroup_rwsem for writing, which waits for an RCU grace period
// whenever no other migration happened in the last few milliseconds: 10-16 ms on this machine, on
// the critical path of every launch and of every restart (bench/RESULTS.md, "Launch: where the
// milliseconds went"). clone3(CLONE_INTO_CGROUP) (Linux 5.7) creates the child in the cgroup
// under the read side of that lock instead, at no measurable cost.
#pragma once

#include <sched.h>
#include <sys/resource.h>
#include <sys/types.h>

namespace ddprun {

// Everything the child needs, prepared by the caller: between clone and exec the child may not
// allocate or take a lock (the agent has other threads).
struct WorkerSpawnSpec {
  const char* path = nullptr;     // absolute path of the executable
  char* const* argv = nullptr;    // null-terminated, argv[0] included
  char* const* envp = nullptr;    // null-terminated: the whole environment
  int stdoutFd = -1;              // becomes fd 1; -1 inherits
  int stderrFd = -1;              // becomes fd 2; -1 inherits
  int inheritFd = -1;             // stays open across exec at its number (the heartbeat channel); -1: none
  unsigned maxFd = 65536;         // fds 3..maxFd are closed on exec when close_range is missing
  const rlimit* fileLimit = nullptr;  // RLIMIT_NOFILE to restore (the agent raised its own)
  const cpu_set_t* cpus = nullptr;    // affinity to set, or null to inherit
  int cgroupDirFd = -1;           // the job cgroup's directory (O_DIRECTORY), or -1: none
  int cgroupProcsFd = -1;         // the same cgroup's cgroup.procs, for the fallback
};

enum class SpawnMethod {
  kAuto,   // clone3 into the cgroup where this build and the kernel allow it, else kVfork
  kVfork,  // vfork, then the child writes itself into cgroup.procs (the fallback, forced in tests)
};

// What happened, beyond the pid.
struct SpawnResult {
  pid_t pid = -1;      // the child, or -1 when nothing runs
  int error = 0;       // errno of the failed clone or exec when pid is -1
  bool cloned = false; // started by clone3 into the cgroup (no migration)
};

// Starts the child in a process group of its own, in the job cgroup, dying with the calling
// thread (PR_SET_PDEATHSIG), with default handlers for every signal the agent catches and
// SIGPIPE, an empty signal mask, no fd of the agent above 2 but spec.inheritFd, and then execs
// spec.path. Returns
// only after the exec succeeded or failed (the child runs on the agent's memory until then).
// When clone3 fails (seccomp filters in some container runtimes answer ENOSYS or EPERM, kernels
// before 5.7 EINVAL, a cgroup we may not enter EACCES), falls back to kVfork; unless the failure
// was for want of resources, sets *clone3Refused so that the caller stops trying.
SpawnResult spawnWorker(const WorkerSpawnSpec& spec, SpawnMethod method, bool* clone3Refused);

}  // namespace ddprun
