// Evidence before a hung rank is killed: its Python stack. ddprun sets PYTHONFAULTHANDLER=1 in
// every worker's environment (unless the user set it), so a Python worker that gets SIGABRT writes
// the stack of each of its threads to its stderr before it dies; the agent reads that dump out of
// the stderr it already captures. Nothing needs to be installed, and it works where ptrace does
// not (containers without CAP_SYS_PTRACE); the price is that the rank dies by it, which a hung
// rank does anyway. Why not py-spy: README "When a job hangs".
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

namespace ddprun {

// How long the agent waits for the dumps before it stops the ranks anyway (a rank in an
// uninterruptible sleep, or one whose faulthandler is off, never writes one).
inline constexpr std::chrono::milliseconds kStackDumpWait{3000};
// At most this many lines of one rank's dump are kept (a thread pool's dump runs long).
inline constexpr std::size_t kMaxStackDumpLines = 160;

// Whether `pid` runs a Python interpreter (its executable's name starts with "python"), so that
// SIGABRT makes it dump its stack rather than leave a core file.
bool isPythonProcess(pid_t pid);

// The last faulthandler dump in a worker's stderr lines ("Fatal Python error: Aborted" and what
// follows it, up to the list of extension modules Python 3.11 appends), cut to
// kMaxStackDumpLines; empty when there is none.
std::vector<std::string> faulthandlerDump(const std::vector<std::string>& stderrLines);

// The lines of stderr before that dump.
std::vector<std::string> beforeFaulthandlerDump(const std::vector<std::string>& stderrLines);

}  // namespace ddprun
