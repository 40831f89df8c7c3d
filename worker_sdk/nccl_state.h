// What an NCCL communicator, its Works and its staging buffers share (internal; only in builds
// with CUDA and NCCL): the NCCL communicator, its stream, the operations in flight, the pinned
// staging pool, and the watchdog thread that fails and aborts what hangs even when nobody waits.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ddp::detail {

using NcclClock = std::chrono::steady_clock;

// Makes `device` current on the calling thread for a scope. It restores the thread's previous
// device, except device 0 when it is not the communicator's: that is what CUDA reports for a
// thread that never chose a device (a helper thread calling wait(), a destructor run elsewhere),
// and making it current would create a context on device 0, which belongs to another local
// rank (hundreds of MB there on a real GPU). One GPU per process, as DDP runs, never needs it.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool restore_ = false;
};

// One operation in flight: done once its event completed; failed when the communicator was
// aborted first (error says why).
struct PendingOp {
  cudaEvent_t event = nullptr;  // owned; destroyed with the op
  std::string what;             // "allReduce #12 (rank 1 of 4, device 1)"
  NcclClock::time_point start;
  NcclClock::time_point deadline;
  bool done = false;
  bool failed = false;
  bool timedOut = false;
  std::string error;
  int device = 0;
  ~PendingOp();
};

// Device memory and its pinned host mirror, of at least `bytes` (a block of the staging pool).
struct StagingBlock {
  void* device = nullptr;
  void* host = nullptr;
  std::size_t capacity = 0;
};

struct NcclState {
  ~NcclState();

  // Records why the communicator is unusable and aborts it, once; fails every pending op.
  void abortLocked(const std::string& why);
  void abort(const std::string& why);
  // Polls until the communicator is no longer ncclInProgress; aborts on an error or at deadline.
  void waitReady(NcclClock::time_point deadline, const std::string& what);

  // Whether op ended (done or failed), checking its event, the asynchronous error and its
  // deadline once; aborts the communicator when op failed or ran past its deadline.
  bool pollLocked(PendingOp& op);
  // Registers an enqueued operation with the watchdog.
  void trackLocked(const std::shared_ptr<PendingOp>& op);

  // The watchdog: polls every op in flight (and the communicator's asynchronous error), so a
  // hung collective is aborted at its deadline even when no thread waits for it. Runs with the
  // communicator's device current (never device 0 by default).
  void startWatchdog();
  void stopWatchdog();

  // Pinned staging blocks, reused: no cudaMalloc, cudaHostAlloc or cudaFree per host all-reduce
  // (cudaFree also synchronizes the whole device).
  StagingBlock takeBlock(std::size_t bytes);
  void giveBlock(StagingBlock block);

  // "<what> (rank R of N, device D)".
  std::string describe(const std::string& what, long seq) const;

  std::mutex mutex;
  ncclComm_t comm = nullptr;
  bool aborted = false;    // comm is gone: aborted, or destroyed
  bool destroyed = false;  // destroyed cleanly, after every operation finished
  std::string failure;     // empty while healthy
  int device = 0;
  int rank = 0;
  int size = 1;
  cudaStream_t stream = nullptr;
  cudaEvent_t order = nullptr;  // recorded on the legacy default stream before each collective
  void* scratch = nullptr;      // one int32 for barrier()
  std::chrono::milliseconds timeout{0};
  long issued = 0;              // operations enqueued, for their names
  std::vector<std::shared_ptr<PendingOp>> pending;
  std::multimap<std::size_t, StagingBlock> freeBlocks;  // by capacity

 private:
  void watchdogLoop();
  std::thread watchdog_;
  std::condition_variable wake_;
  bool stopping_ = false;
};

}  // namespace ddp::detail
