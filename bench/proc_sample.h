// A process's CPU seconds, RSS and threads from /proc (bench/rdzv_capacity.cc reads the daemon's
// and its own at every phase).
#pragma once

#include <sys/types.h>

namespace capacity {

struct ProcSample {
  double cpuS = 0;  // utime + stime, every thread
  long rssKb = 0;
  long hwmKb = 0;
  long threads = 0;
  bool ok = false;
};

// pid 0: this process.
ProcSample sampleProc(pid_t pid);

}  // namespace capacity
