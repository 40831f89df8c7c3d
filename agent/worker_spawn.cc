#include "agent/worker_spawn.h"

#include <fcntl.h>
#include <linux/sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

namespace ddprun {
namespace {

// Shared with the child, which runs on the agent's memory until it execs: it reports a failed
// exec here.
struct ChildContext {
  const WorkerSpawnSpec* spec;
  pid_t agentPid;
  bool moveIntoCgroup;  // the fallback: write cgroup.procs
  volatile int error;
};

// The child, between clone and exec: async-signal-safe system calls only.
[[noreturn]] void childMain(void* raw) {
  auto* ctx = static_cast<ChildContext*>(raw);
  const WorkerSpawnSpec& spec = *ctx->spec;
  ::setpgid(0, 0);
  if (ctx->moveIntoCgroup && spec.cgroupProcsFd >= 0) (void)!::write(spec.cgroupProcsFd, "0", 1);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != ctx->agentPid) ::_exit(127);  // the agent died before prctl took effect
  if (spec.stdoutFd >= 0) ::dup2(spec.stdoutFd, STDOUT_FILENO);
  if (spec.stderrFd >= 0) ::dup2(spec.stderrFd, STDERR_FILENO);
  // The agent's handlers must never run here (they would write to the agent's own signal pipe),
  // and ignored signals survive exec: the agent ignores SIGPIPE, a worker must not. Signals are
  // blocked until this is done (the caller blocked them before the clone).
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < SIGRTMIN; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) != 0) continue;
    if (sig == SIGPIPE || (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN)) ::sigaction(sig, &dfl, nullptr);
  }
  if (spec.fileLimit) ::setrlimit(RLIMIT_NOFILE, spec.fileLimit);
  if (spec.cpus) ::sched_setaffinity(0, sizeof(cpu_set_t), spec.cpus);
  // No fd of the agent (pipes of other workers, sockets, the lifeline) may leak into a worker.
  if (::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) != 0) {
    for (unsigned fd = 3; fd < spec.maxFd; ++fd) ::fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);
  }
  // The worker's channel end: CLOEXEC in the agent (no other worker may inherit it), not here.
  if (spec.inheritFd >= 0) ::fcntl(spec.inheritFd, F_SETFD, 0);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::execve(spec.path, spec.argv, spec.envp);
  ctx->error = errno;
  ::_exit(127);
}

#if defined(__x86_64__)
constexpr bool kHasClone3 = true;

// clone3 with CLONE_VM | CLONE_VFORK: like vfork (no copy of the agent's page tables, the agent's
// thread waits until the child execs or exits), plus CLONE_INTO_CGROUP. The child cannot return
// into this function's frame as a vfork child does, because clone3 starts it on its own stack:
// the few instructions below call childMain there. Returns the child's pid or -errno.
long clone3Vm(clone_args* args, void (*entry)(void*), void* arg) {
  long ret;
  register void (*fn)(void*) asm("r12") = entry;
  register void* fnArg asm("r13") = arg;
  asm volatile(
      "syscall\n\t"
      "testq %%rax, %%rax\n\t"
      "jnz 1f\n\t"
      "xorl %%ebp, %%ebp\n\t"  // the outermost frame of the child's stack
      "movq %%r13, %%rdi\n\t"
      "callq *%%r12\n\t"
      "ud2\n"  // childMain does not return
      "1:\n\t"
      : "=a"(ret)
      : "0"(static_cast<long>(SYS_clone3)), "D"(args), "S"(sizeof(clone_args)), "r"(fn), "r"(fnArg)
      : "rcx", "r11", "memory", "cc");
  return ret;
}
#else
constexpr bool kHasClone3 = false;
long clone3Vm(clone_args*, void (*)(void*), void*) { return -ENOSYS; }
#endif

// The child's stack under clone3: childMain's frames and glibc's lazy symbol binding, which saves
// the whole vector register state (a few KiB with AVX-512). 64 KiB leaves ample room.
constexpr size_t kChildStackBytes = 64 * 1024;

// Blocks every signal of the calling thread while it exists: a child that shares the agent's
// memory must not run the agent's handlers before it has reset them.
class BlockAllSignals {
 public:
  BlockAllSignals() {
    sigset_t all;
    sigfillset(&all);
    ::pthread_sigmask(SIG_SETMASK, &all, &saved_);
  }
  ~BlockAllSignals() { ::pthread_sigmask(SIG_SETMASK, &saved_, nullptr); }
  BlockAllSignals(const BlockAllSignals&) = delete;
  BlockAllSignals& operator=(const BlockAllSignals&) = delete;

 private:
  sigset_t saved_;
};

SpawnResult viaVfork(ChildContext& ctx) {
  SpawnResult result;
  ctx.moveIntoCgroup = true;
  pid_t pid = ::vfork();
  if (pid == 0) childMain(&ctx);
  if (pid < 0) {
    result.error = errno;
    return result;
  }
  result.pid = pid;
  return result;
}

}  // namespace

SpawnResult spawnWorker(const WorkerSpawnSpec& spec, SpawnMethod method, bool* clone3Refused) {
  ChildContext ctx{&spec, ::getpid(), false, 0};
  SpawnResult result;
  {
    BlockAllSignals blocked;
    const bool tryClone3 = kHasClone3 && method == SpawnMethod::kAuto && spec.cgroupDirFd >= 0 &&
                           !(clone3Refused && *clone3Refused);
    if (tryClone3) {
      // Allocated here, not in the child; freed once the child has exec'd or exited (CLONE_VFORK).
      auto stack = std::make_unique_for_overwrite<unsigned char[]>(kChildStackBytes);
      clone_args args{};
      args.flags = CLONE_VM | CLONE_VFORK | CLONE_INTO_CGROUP;
      args.exit_signal = SIGCHLD;
      args.stack = reinterpret_cast<__u64>(stack.get());
      args.stack_size = kChildStackBytes;
      args.cgroup = static_cast<__u64>(spec.cgroupDirFd);
      long ret = clone3Vm(&args, childMain, &ctx);
      if (ret > 0) {
        result.pid = static_cast<pid_t>(ret);
        result.cloned = true;
      } else {
        // Refused (ENOSYS or EPERM from a seccomp filter, EINVAL before Linux 5.7, EACCES on the
        // cgroup) or out of resources: vfork reports the latter again, and the former for good.
        if (clone3Refused && ret != -EAGAIN && ret != -ENOMEM) *clone3Refused = true;
        result = viaVfork(ctx);
      }
    } else {
      result = viaVfork(ctx);
    }
  }
  if (result.pid > 0 && ctx.error != 0) {
    // The exec failed: the child has exited with 127; reap it here, nobody else knows it.
    int status = 0;
    while (::waitpid(result.pid, &status, 0) < 0 && errno == EINTR) {
    }
    result.pid = -1;
    result.error = ctx.error;
    result.cloned = false;
  }
  return result;
}

}  // namespace ddprun
