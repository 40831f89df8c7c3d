// The simulated CUDA runtime's state (internal to libsimgpu): devices, the calling thread's
// current device and what it touched, device memory (host memory the runtime owns, every pointer
// checked), pinned host memory, and streams: ordered queues, each run by a thread of its own, so
// work completes after the call that enqueued it returned, as on a GPU.
#pragma once

#include <cuda_runtime_api.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tests/simgpu/faults.h"

namespace simgpu {

// One piece of stream work. `run` executes on the stream's thread once every dependency is done.
struct Task {
  std::function<void()> run;
  std::vector<std::shared_ptr<Task>> deps;
  bool done = false;  // guarded by Runtime::mutex()
};
using TaskPtr = std::shared_ptr<Task>;

class Stream;

// A device allocation: [base, base + size) on `device` (a physical simulated device).
struct DeviceRange {
  int device = -1;
  std::byte* base = nullptr;
  std::size_t size = 0;
};

// Why a pointer is not usable device memory, as CUDA would say it.
enum class PointerCheck { kOk, kHostPointer, kFreed, kOutOfRange, kWrongDevice };

class Runtime {
 public:
  // The process's runtime, made on first use and never destroyed (stream threads may outlive main).
  static Runtime& get();

  // Devices this process sees (DDPRUN_SIMGPU_DEVICES, narrowed by CUDA_VISIBLE_DEVICES).
  int deviceCount() const { return static_cast<int>(visible_.size()); }
  // Visible ordinal -> simulated physical device.
  int physical(int ordinal) const { return visible_.at(static_cast<std::size_t>(ordinal)); }

  // The calling thread's device (ordinal) for a call that needs a context; a thread that never
  // called cudaSetDevice gets device 0, and the stray context is counted.
  int contextDevice();
  // cudaGetDevice: no context is made.
  int currentDevice() const;
  void setDevice(int ordinal);
  // Records that the calling thread made a context on `ordinal`.
  void touch(int ordinal);

  cudaError_t malloc(void** ptr, std::size_t bytes);
  cudaError_t free(void* ptr);
  cudaError_t hostAlloc(void** ptr, std::size_t bytes);
  cudaError_t freeHost(void* ptr);
  // Whether [ptr, ptr + bytes) is live device memory of physical device `device` (-1: any).
  PointerCheck checkDevice(const void* ptr, std::size_t bytes, int device, DeviceRange* range = nullptr) const;
  // Whether ptr is in a cudaHostAlloc'd block (pinned): copies from and to it are asynchronous.
  bool isPinned(const void* ptr, std::size_t bytes) const;

  // Streams. nullptr and cudaStreamLegacy mean the legacy default stream of the current device.
  cudaStream_t createStream(bool blocking);
  std::shared_ptr<Stream> stream(cudaStream_t handle);  // null when not a live stream
  bool destroyStream(cudaStream_t handle);
  // Enqueues fn on the stream with CUDA's legacy-default-stream ordering, after `after` too
  // (cudaStreamWaitEvent); returns the task.
  TaskPtr enqueue(Stream& stream, std::function<void()> fn, TaskPtr after = nullptr);
  // Blocks until the task ran.
  void waitTask(const TaskPtr& task);
  bool isDone(const TaskPtr& task);

  std::mutex& mutex() { return mutex_; }
  std::condition_variable& changed() { return changed_; }
  Faults& faults() { return faults_; }

  // Counters and touches for simgpu.h.
  unsigned touchedMask();
  long implicitDevice0Calls();
  void resetTouches();
  long counter(const char* name);
  long liveAllocations();

 private:
  Runtime();
  void reportAtExit();

  std::vector<int> visible_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  Faults faults_;
  std::map<const std::byte*, DeviceRange> device_;  // live device allocations by base
  std::map<const std::byte*, DeviceRange> freed_;   // quarantined (poisoned) freed allocations
  std::size_t quarantineBytes_ = 0;
  std::map<const std::byte*, std::size_t> pinned_;  // cudaHostAlloc'd blocks
  std::map<cudaStream_t, std::shared_ptr<Stream>> streams_;
  std::map<int, std::shared_ptr<Stream>> legacy_;   // by physical device
  unsigned touched_ = 0;
  long implicit_ = 0;
  std::map<std::string, long> counters_;
  friend class Stream;
};

// An ordered queue of work on one device, executed by its own thread.
class Stream : public std::enable_shared_from_this<Stream> {
 public:
  Stream(Runtime& runtime, int physicalDevice, bool blocking, bool legacy);
  void start();
  // Ends the thread once the queue is empty (cudaStreamDestroy returns at once, as CUDA's does).
  void retire();

  const int device;     // physical
  const bool blocking;  // ordered with the legacy default stream
  const bool legacy;    // the legacy default stream itself
  TaskPtr last;         // the last task enqueued (guarded by the runtime's mutex)

 private:
  friend class Runtime;
  void loop();
  Runtime& runtime_;
  std::vector<TaskPtr> queue_;  // guarded by the runtime's mutex; front = next to run
  bool retired_ = false;
};

// The calling thread's last error (cudaGetLastError), set by every failing call.
cudaError_t setLastError(cudaError_t rc);

}  // namespace simgpu
