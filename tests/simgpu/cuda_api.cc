// The CUDA runtime entry points ddprun calls, with cuda_runtime_api.h's signatures, on simulated
// devices (runtime.h). Errors are the codes CUDA returns for the same misuse; every failing call
// also sets the thread's last error (cudaGetLastError).
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "tests/simgpu/runtime.h"
#include "tests/simgpu/simgpu.h"

namespace simgpu {

cudaError_t takeLastError();

namespace {

// An event: the marker task its last cudaEventRecord enqueued (none: never recorded, complete).
struct Event {
  int device = -1;  // physical
  TaskPtr marker;
};

std::mutex eventsMutex;
std::set<cudaEvent_t> liveEvents;

Event* findEvent(cudaEvent_t handle) {
  std::lock_guard<std::mutex> lock(eventsMutex);
  return liveEvents.count(handle) ? reinterpret_cast<Event*>(handle) : nullptr;
}

cudaError_t fail(cudaError_t rc) { return setLastError(rc); }

cudaError_t noDevice() {
  return Runtime::get().deviceCount() == 0 ? fail(cudaErrorNoDevice) : cudaSuccess;
}

// The checks cudaMemcpyAsync makes on one side of a copy: device memory where `device` says so,
// else memory that is not device memory (a device pointer given as host memory is refused too).
cudaError_t checkSide(const void* p, std::size_t bytes, bool device, int streamDevice) {
  const PointerCheck check = Runtime::get().checkDevice(p, bytes, device ? streamDevice : -1);
  if (!device) return check == PointerCheck::kHostPointer ? cudaSuccess : cudaErrorInvalidValue;
  return check == PointerCheck::kOk ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace

}  // namespace simgpu

using simgpu::Runtime;

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  if (!count) return simgpu::fail(cudaErrorInvalidValue);
  *count = Runtime::get().deviceCount();
  return simgpu::noDevice();
}

cudaError_t cudaSetDevice(int device) {
  if (cudaError_t rc = simgpu::noDevice()) return rc;
  if (device < 0 || device >= Runtime::get().deviceCount()) return simgpu::fail(cudaErrorInvalidDevice);
  Runtime::get().setDevice(device);
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (!device) return simgpu::fail(cudaErrorInvalidValue);
  if (cudaError_t rc = simgpu::noDevice()) return rc;
  *device = Runtime::get().currentDevice();
  return cudaSuccess;
}

cudaError_t cudaGetLastError(void) { return simgpu::takeLastError(); }

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    default: return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    default: return "unknown error";
  }
}

cudaError_t cudaMalloc(void** devPtr, size_t size) {
  if (!devPtr) return simgpu::fail(cudaErrorInvalidValue);
  if (cudaError_t rc = simgpu::noDevice()) return rc;
  return simgpu::fail(Runtime::get().malloc(devPtr, size));
}

cudaError_t cudaFree(void* devPtr) {
  if (cudaError_t rc = simgpu::noDevice()) return rc;
  return simgpu::fail(Runtime::get().free(devPtr));
}

cudaError_t cudaHostAlloc(void** pHost, size_t size, unsigned int) {
  if (!pHost) return simgpu::fail(cudaErrorInvalidValue);
  if (cudaError_t rc = simgpu::noDevice()) return rc;
  return simgpu::fail(Runtime::get().hostAlloc(pHost, size));
}

cudaError_t cudaMallocHost(void** ptr, size_t size) { return cudaHostAlloc(ptr, size, 0); }

cudaError_t cudaFreeHost(void* ptr) {
  if (cudaError_t rc = simgpu::noDevice()) return rc;
  return simgpu::fail(Runtime::get().freeHost(ptr));
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int flags) {
  if (!pStream || (flags & ~cudaStreamNonBlocking)) return simgpu::fail(cudaErrorInvalidValue);
  if (cudaError_t rc = simgpu::noDevice()) return rc;
  *pStream = Runtime::get().createStream((flags & cudaStreamNonBlocking) == 0);
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* pStream) { return cudaStreamCreateWithFlags(pStream, cudaStreamDefault); }

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (cudaError_t rc = simgpu::noDevice()) return rc;
  return Runtime::get().destroyStream(stream) ? cudaSuccess : simgpu::fail(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (cudaError_t rc = simgpu::noDevice()) return rc;
  auto s = Runtime::get().stream(stream);
  if (!s) return simgpu::fail(cudaErrorInvalidResourceHandle);
  simgpu::TaskPtr last;
  {
    std::lock_guard<std::mutex> lock(Runtime::get().mutex());
    last = s->last;
  }
  if (last) Runtime::get().waitTask(last);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (!event || (flags & ~(cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess))) {
    return simgpu::fail(cudaErrorInvalidValue);
  }
  if (cudaError_t rc = simgpu::noDevice()) return rc;
  Runtime& rt = Runtime::get();
  const int device = rt.physical(rt.contextDevice());
  {
    std::lock_guard<std::mutex> lock(rt.mutex());
    simgpu::Faults& f = rt.faults();
    if (f.failEventCreate > 0 && ++f.eventsSeen == f.failEventCreate && f.appliesTo(-1)) {
      return simgpu::fail(cudaErrorMemoryAllocation);
    }
  }
  auto* e = new simgpu::Event{device, nullptr};
  *event = reinterpret_cast<cudaEvent_t>(e);
  std::lock_guard<std::mutex> lock(simgpu::eventsMutex);
  simgpu::liveEvents.insert(*event);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

// As CUDA: returns at once; a recorded marker still in flight is released when it completes.
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (cudaError_t rc = simgpu::noDevice()) return rc;
  Runtime::get().contextDevice();
  std::lock_guard<std::mutex> lock(simgpu::eventsMutex);
  if (!simgpu::liveEvents.erase(event)) return simgpu::fail(cudaErrorInvalidResourceHandle);
  delete reinterpret_cast<simgpu::Event*>(event);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (cudaError_t rc = simgpu::noDevice()) return rc;
  simgpu::Event* e = simgpu::findEvent(event);
  auto s = Runtime::get().stream(stream);
  if (!e || !s) return simgpu::fail(cudaErrorInvalidResourceHandle);
  // An event and the stream it records must belong to the same device (context).
  if (e->device != s->device) return simgpu::fail(cudaErrorInvalidResourceHandle);
  long lagMs = 0;
  {
    std::lock_guard<std::mutex> lock(Runtime::get().mutex());
    if (Runtime::get().faults().appliesTo(-1)) lagMs = Runtime::get().faults().eventLagMs;
  }
  auto marker = Runtime::get().enqueue(*s, [lagMs] {
    if (lagMs > 0) std::this_thread::sleep_for(std::chrono::milliseconds(lagMs));
  });
  std::lock_guard<std::mutex> lock(simgpu::eventsMutex);
  e->marker = std::move(marker);
  return cudaSuccess;
}

// The stream's later work waits for the work the event captured when it was last recorded.
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  if (cudaError_t rc = simgpu::noDevice()) return rc;
  if (flags != 0 && flags != cudaEventWaitExternal) return simgpu::fail(cudaErrorInvalidValue);
  auto s = Runtime::get().stream(stream);
  if (!s) return simgpu::fail(cudaErrorInvalidResourceHandle);
  simgpu::TaskPtr marker;
  {
    std::lock_guard<std::mutex> lock(simgpu::eventsMutex);
    if (!simgpu::liveEvents.count(event)) return simgpu::fail(cudaErrorInvalidResourceHandle);
    marker = reinterpret_cast<simgpu::Event*>(event)->marker;
  }
  if (marker) Runtime::get().enqueue(*s, [] {}, marker);
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (cudaError_t rc = simgpu::noDevice()) return rc;
  Runtime::get().contextDevice();
  simgpu::TaskPtr marker;
  {
    std::lock_guard<std::mutex> lock(simgpu::eventsMutex);
    if (!simgpu::liveEvents.count(event)) return simgpu::fail(cudaErrorInvalidResourceHandle);
    marker = reinterpret_cast<simgpu::Event*>(event)->marker;
  }
  return (!marker || Runtime::get().isDone(marker)) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (cudaError_t rc = simgpu::noDevice()) return rc;
  Runtime::get().contextDevice();
  simgpu::TaskPtr marker;
  {
    std::lock_guard<std::mutex> lock(simgpu::eventsMutex);
    if (!simgpu::liveEvents.count(event)) return simgpu::fail(cudaErrorInvalidResourceHandle);
    marker = reinterpret_cast<simgpu::Event*>(event)->marker;
  }
  if (marker) Runtime::get().waitTask(marker);
  return cudaSuccess;
}

// Copies run in stream order on the stream's thread. Host memory from cudaHostAlloc (pinned):
// fully asynchronous. Pageable host memory, as CUDA documents it: device to host returns once
// the copy completed; host to device "may synchronize with the stream" to stage the source, and
// simgpu always does (the strict reading): it returns once the stream reached the copy.
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream) {
  if (cudaError_t rc = simgpu::noDevice()) return rc;
  Runtime& rt = Runtime::get();
  auto s = rt.stream(stream);
  if (!s) return simgpu::fail(cudaErrorInvalidResourceHandle);
  if (count == 0) return cudaSuccess;
  if (!dst || !src) return simgpu::fail(cudaErrorInvalidValue);
  if (kind == cudaMemcpyDefault) {
    const bool srcDev = rt.checkDevice(src, 1, -1) != simgpu::PointerCheck::kHostPointer;
    const bool dstDev = rt.checkDevice(dst, 1, -1) != simgpu::PointerCheck::kHostPointer;
    kind = srcDev ? (dstDev ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost)
                  : (dstDev ? cudaMemcpyHostToDevice : cudaMemcpyHostToHost);
  }
  const bool srcDevice = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  const bool dstDevice = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDeviceToDevice) return simgpu::fail(cudaErrorInvalidValue);
  if (cudaError_t rc = simgpu::checkSide(src, count, srcDevice, s->device)) return simgpu::fail(rc);
  if (cudaError_t rc = simgpu::checkSide(dst, count, dstDevice, s->device)) return simgpu::fail(rc);
  auto task = rt.enqueue(*s, [dst, src, count] { std::memcpy(dst, src, count); });
  const bool pageable = (kind == cudaMemcpyHostToDevice && !rt.isPinned(src, count)) ||
                        (kind == cudaMemcpyDeviceToHost && !rt.isPinned(dst, count)) || kind == cudaMemcpyHostToHost;
  if (pageable) rt.waitTask(task);
  return cudaSuccess;
}

// simgpu.h

unsigned simgpu_touched_devices(void) { return Runtime::get().touchedMask(); }
long simgpu_implicit_device0_calls(void) { return Runtime::get().implicitDevice0Calls(); }
void simgpu_reset_touches(void) { Runtime::get().resetTouches(); }
long simgpu_device_malloc_calls(void) { return Runtime::get().counter("malloc"); }
long simgpu_device_free_calls(void) { return Runtime::get().counter("free"); }
long simgpu_host_alloc_calls(void) { return Runtime::get().counter("host_alloc"); }
long simgpu_live_device_allocations(void) { return Runtime::get().liveAllocations(); }
void simgpu_reload_faults(void) {
  simgpu::Faults fresh = simgpu::Faults::fromEnviron();
  std::lock_guard<std::mutex> lock(Runtime::get().mutex());
  Runtime::get().faults() = fresh;
}

namespace {
std::mutex blocksMutex;
std::map<unsigned long, std::shared_ptr<bool>> blocks;  // released flags, guarded by the runtime's mutex
unsigned long nextBlock = 0;
}  // namespace

unsigned long simgpu_block_stream(cudaStream_t stream) {
  Runtime& rt = Runtime::get();
  auto s = rt.stream(stream);
  if (!s) return 0;
  auto released = std::make_shared<bool>(false);
  unsigned long handle;
  {
    std::lock_guard<std::mutex> lock(blocksMutex);
    handle = ++nextBlock;
    blocks[handle] = released;
  }
  rt.enqueue(*s, [released, &rt] {
    std::unique_lock<std::mutex> lock(rt.mutex());
    rt.changed().wait(lock, [&] { return *released; });
  });
  return handle;
}

void simgpu_release_stream_block(unsigned long handle) {
  std::shared_ptr<bool> released;
  {
    std::lock_guard<std::mutex> lock(blocksMutex);
    auto it = blocks.find(handle);
    if (it == blocks.end()) return;
    released = it->second;
    blocks.erase(it);
  }
  Runtime& rt = Runtime::get();
  std::lock_guard<std::mutex> lock(rt.mutex());
  *released = true;
  rt.changed().notify_all();
}

}  // extern "C"
