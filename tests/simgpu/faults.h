// Fault injection for libsimgpu, read from the environment (docs/simgpu.md lists the variables).
// Counts are 1-based and per process (cudaMalloc, cudaEventCreate*) or per communicator
// (collectives); 0 turns a fault off. Faults fire only on the rank DDPRUN_SIMGPU_FAULT_RANK names
// (the process's RANK for CUDA faults, the communicator rank for NCCL ones; unset: every rank)
// and only in the first attempt of a job (TORCHELASTIC_RESTART_COUNT unset or 0), so that a
// restarted group runs clean.
#pragma once

namespace simgpu {

struct Faults {
  long failMalloc = 0;        // DDPRUN_SIMGPU_FAIL_MALLOC: this cudaMalloc fails (out of memory)
  long failEventCreate = 0;   // DDPRUN_SIMGPU_FAIL_EVENT_CREATE: this event creation fails
  long hangCollective = 0;    // DDPRUN_SIMGPU_HANG_COLLECTIVE: this collective never completes
  long asyncErrorCollective = 0;  // DDPRUN_SIMGPU_ASYNC_ERROR: this collective fails asynchronously
  long slowMs = 0;            // DDPRUN_SIMGPU_SLOW_MS: every collective starts this late
  // DDPRUN_SIMGPU_EVENT_LAG_MS: an event completes this long after the work before it on its
  // stream (the stream reaches the event later than the kernel ends: never at the same instant).
  long eventLagMs = 0;
  int rank = -1;              // DDPRUN_SIMGPU_FAULT_RANK
  bool firstAttempt = true;   // TORCHELASTIC_RESTART_COUNT is unset or 0
  // Calls seen since the faults were (re)loaded, guarded by the runtime's mutex.
  long mallocsSeen = 0;
  long eventsSeen = 0;

  static Faults fromEnviron();
  // Whether a fault applies to `rank` (-1: the process's RANK).
  bool appliesTo(int rank) const;
};

}  // namespace simgpu
