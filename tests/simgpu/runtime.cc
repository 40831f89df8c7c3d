#include "tests/simgpu/runtime.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace simgpu {

namespace {

constexpr int kDefaultDevices = 4;
constexpr int kMaxDevices = 32;  // the touched mask is 32 bits
// Freed device memory stays poisoned and recognizable as freed until this much is quarantined.
constexpr std::size_t kQuarantineBytes = 64u << 20;
constexpr unsigned char kPoison = 0xdb;

long envLong(const char* name, long fallback) {
  const char* text = std::getenv(name);
  if (!text || !*text) return fallback;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  return (end && *end == '\0') ? value : fallback;
}

// The thread's current device as an ordinal; -1 until cudaSetDevice.
thread_local int tlsDevice = -1;
thread_local cudaError_t tlsLastError = cudaSuccess;

}  // namespace

cudaError_t setLastError(cudaError_t rc) {
  if (rc != cudaSuccess && rc != cudaErrorNotReady) tlsLastError = rc;
  return rc;
}

cudaError_t takeLastError() {
  const cudaError_t rc = tlsLastError;
  tlsLastError = cudaSuccess;
  return rc;
}

Faults Faults::fromEnviron() {
  Faults f;
  f.failMalloc = envLong("DDPRUN_SIMGPU_FAIL_MALLOC", 0);
  f.failEventCreate = envLong("DDPRUN_SIMGPU_FAIL_EVENT_CREATE", 0);
  f.hangCollective = envLong("DDPRUN_SIMGPU_HANG_COLLECTIVE", 0);
  f.asyncErrorCollective = envLong("DDPRUN_SIMGPU_ASYNC_ERROR", 0);
  f.slowMs = envLong("DDPRUN_SIMGPU_SLOW_MS", 0);
  f.eventLagMs = envLong("DDPRUN_SIMGPU_EVENT_LAG_MS", 0);
  f.rank = static_cast<int>(envLong("DDPRUN_SIMGPU_FAULT_RANK", -1));
  f.firstAttempt = envLong("TORCHELASTIC_RESTART_COUNT", 0) == 0;
  return f;
}

bool Faults::appliesTo(int r) const {
  if (!firstAttempt) return false;
  if (r < 0) r = static_cast<int>(envLong("RANK", -1));
  return rank < 0 || rank == r;
}

Runtime& Runtime::get() {
  static Runtime* runtime = new Runtime();  // never destroyed: stream threads may still run at exit
  return *runtime;
}

Runtime::Runtime() : faults_(Faults::fromEnviron()) {
  const long devices = envLong("DDPRUN_SIMGPU_DEVICES", kDefaultDevices);
  const int physicalCount = static_cast<int>(devices < 0 ? 0 : (devices > kMaxDevices ? kMaxDevices : devices));
  // CUDA_VISIBLE_DEVICES as CUDA reads it: ordinals up to the first one that is invalid.
  if (const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES")) {
    std::string list = cvd;
    std::size_t start = 0;
    while (start <= list.size()) {
      const std::size_t comma = std::min(list.find(',', start), list.size());
      const std::string item = list.substr(start, comma - start);
      char* end = nullptr;
      const long d = std::strtol(item.c_str(), &end, 10);
      if (item.empty() || *end != '\0' || d < 0 || d >= physicalCount) break;
      visible_.push_back(static_cast<int>(d));
      start = comma + 1;
    }
  } else {
    for (int d = 0; d < physicalCount; ++d) visible_.push_back(d);
  }
  if (std::getenv("DDPRUN_SIMGPU_REPORT")) {
    std::atexit([] { Runtime::get().reportAtExit(); });
  }
}

// One line per process: "pid=P rank=R touched=0,3 implicit_device0_calls=N".
void Runtime::reportAtExit() {
  const char* path = std::getenv("DDPRUN_SIMGPU_REPORT");
  FILE* out = path ? std::fopen(path, "a") : nullptr;
  if (!out) return;
  std::string devices;
  const unsigned mask = touchedMask();
  for (int d = 0; d < kMaxDevices; ++d) {
    if (mask & (1u << d)) devices += (devices.empty() ? "" : ",") + std::to_string(d);
  }
  const char* rank = std::getenv("RANK");
  const char* local = std::getenv("LOCAL_RANK");
  std::fprintf(out, "pid=%d rank=%s local_rank=%s touched=%s implicit_device0_calls=%ld\n", static_cast<int>(getpid()),
               rank ? rank : "-", local ? local : "-", devices.empty() ? "-" : devices.c_str(), implicitDevice0Calls());
  std::fclose(out);
}

int Runtime::contextDevice() {
  if (tlsDevice < 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++implicit_;
    if (!visible_.empty()) touched_ |= 1u << visible_[0];
    return 0;
  }
  touch(tlsDevice);
  return tlsDevice;
}

int Runtime::currentDevice() const { return tlsDevice < 0 ? 0 : tlsDevice; }

void Runtime::setDevice(int ordinal) {
  tlsDevice = ordinal;
  touch(ordinal);  // CUDA 12+: cudaSetDevice makes the device's primary context current
}

void Runtime::touch(int ordinal) {
  std::lock_guard<std::mutex> lock(mutex_);
  touched_ |= 1u << physical(ordinal);
}

cudaError_t Runtime::malloc(void** ptr, std::size_t bytes) {
  const int device = physical(contextDevice());
  std::lock_guard<std::mutex> lock(mutex_);
  if (faults_.failMalloc > 0 && ++faults_.mallocsSeen == faults_.failMalloc && faults_.appliesTo(-1)) {
    return cudaErrorMemoryAllocation;
  }
  // CUDA rounds allocations up (256 bytes at least); a zero-byte request gives no pointer.
  if (bytes == 0) {
    *ptr = nullptr;
    return cudaSuccess;
  }
  auto* base = static_cast<std::byte*>(std::aligned_alloc(256, (bytes + 255) / 256 * 256));
  if (!base) return cudaErrorMemoryAllocation;
  std::memset(base, kPoison, bytes);  // uninitialized device memory is not zero
  device_[base] = DeviceRange{device, base, bytes};
  freed_.erase(base);
  ++counters_["malloc"];
  *ptr = base;
  return cudaSuccess;
}

cudaError_t Runtime::free(void* ptr) {
  contextDevice();
  if (!ptr) return cudaSuccess;
  std::unique_lock<std::mutex> lock(mutex_);
  auto it = device_.find(static_cast<std::byte*>(ptr));
  if (it == device_.end()) return cudaErrorInvalidValue;  // freed twice, not a base, or host memory
  // cudaFree synchronizes the device: work enqueued before it, on any of the device's streams,
  // completes first (a hung kernel blocks it for as long as it hangs).
  std::vector<TaskPtr> earlier;
  for (auto& [handle, s] : streams_) {
    if (s->device == it->second.device && s->last && !s->last->done) earlier.push_back(s->last);
  }
  if (auto l = legacy_.find(it->second.device); l != legacy_.end() && l->second->last && !l->second->last->done) {
    earlier.push_back(l->second->last);
  }
  changed_.wait(lock, [&] {
    for (const auto& t : earlier) {
      if (!t->done) return false;
    }
    return true;
  });
  it = device_.find(static_cast<std::byte*>(ptr));
  if (it == device_.end()) return cudaErrorInvalidValue;  // freed by another thread meanwhile
  const DeviceRange range = it->second;
  device_.erase(it);
  std::memset(range.base, kPoison, range.size);
  freed_[range.base] = range;
  quarantineBytes_ += range.size;
  while (quarantineBytes_ > kQuarantineBytes && !freed_.empty()) {
    auto oldest = freed_.begin();
    quarantineBytes_ -= oldest->second.size;
    std::free(oldest->second.base);
    freed_.erase(oldest);
  }
  ++counters_["free"];
  return cudaSuccess;
}

cudaError_t Runtime::hostAlloc(void** ptr, std::size_t bytes) {
  contextDevice();
  auto* base = static_cast<std::byte*>(std::malloc(bytes ? bytes : 1));
  if (!base) return cudaErrorMemoryAllocation;
  std::lock_guard<std::mutex> lock(mutex_);
  pinned_[base] = bytes;
  ++counters_["host_alloc"];
  *ptr = base;
  return cudaSuccess;
}

cudaError_t Runtime::freeHost(void* ptr) {
  contextDevice();
  if (!ptr) return cudaSuccess;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = pinned_.find(static_cast<std::byte*>(ptr));
  if (it == pinned_.end()) return cudaErrorInvalidValue;
  pinned_.erase(it);
  std::free(ptr);
  return cudaSuccess;
}

namespace {

// The range in `ranges` that holds p, or end().
template <typename Map>
auto containing(const Map& ranges, const std::byte* p) {
  auto it = ranges.upper_bound(p);
  if (it == ranges.begin()) return ranges.end();
  --it;
  return (p < it->first + it->second.size || (it->second.size == 0 && p == it->first)) ? it : ranges.end();
}

}  // namespace

PointerCheck Runtime::checkDevice(const void* ptr, std::size_t bytes, int device, DeviceRange* range) const {
  const auto* p = static_cast<const std::byte*>(ptr);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = containing(device_, p);
  if (it == device_.end()) return containing(freed_, p) != freed_.end() ? PointerCheck::kFreed : PointerCheck::kHostPointer;
  if (static_cast<std::size_t>(it->first + it->second.size - p) < bytes) return PointerCheck::kOutOfRange;
  if (device >= 0 && it->second.device != device) return PointerCheck::kWrongDevice;
  if (range) *range = it->second;
  return PointerCheck::kOk;
}

bool Runtime::isPinned(const void* ptr, std::size_t bytes) const {
  const auto* p = static_cast<const std::byte*>(ptr);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = pinned_.upper_bound(p);
  if (it == pinned_.begin()) return false;
  --it;
  const auto offset = static_cast<std::size_t>(p - it->first);  // p >= it->first here
  return offset < it->second && bytes <= it->second - offset;
}

cudaStream_t Runtime::createStream(bool blocking) {
  const int device = physical(contextDevice());
  auto stream = std::make_shared<Stream>(*this, device, blocking, false);
  // The handle is an address that is never dereferenced as a CUstream_st.
  auto handle = reinterpret_cast<cudaStream_t>(new char);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    streams_[handle] = stream;
  }
  stream->start();
  return handle;
}

std::shared_ptr<Stream> Runtime::stream(cudaStream_t handle) {
  if (handle == nullptr || handle == cudaStreamLegacy || handle == cudaStreamPerThread) {
    const int device = physical(contextDevice());
    std::shared_ptr<Stream> created;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto& legacy = legacy_[device];
      if (legacy) return legacy;
      legacy = created = std::make_shared<Stream>(*this, device, true, true);
    }
    created->start();
    return created;
  }
  contextDevice();
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = streams_.find(handle);
  return it == streams_.end() ? nullptr : it->second;
}

bool Runtime::destroyStream(cudaStream_t handle) {
  contextDevice();
  std::shared_ptr<Stream> stream;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = streams_.find(handle);
    if (it == streams_.end()) return false;
    stream = it->second;
    streams_.erase(it);
  }
  stream->retire();
  delete reinterpret_cast<char*>(handle);
  return true;
}

TaskPtr Runtime::enqueue(Stream& stream, std::function<void()> fn, TaskPtr after) {
  auto task = std::make_shared<Task>();
  task->run = std::move(fn);
  std::lock_guard<std::mutex> lock(mutex_);
  if (after && !after->done) task->deps.push_back(std::move(after));
  // The legacy default stream waits for all earlier work of the device's blocking streams; a
  // blocking stream waits for earlier work of the legacy default stream. Non-blocking: neither.
  auto pending = [](const TaskPtr& t) { return t && !t->done; };
  if (stream.legacy) {
    for (auto& [handle, other] : streams_) {
      if (other->device == stream.device && other->blocking && pending(other->last)) task->deps.push_back(other->last);
    }
  } else if (stream.blocking) {
    auto it = legacy_.find(stream.device);
    if (it != legacy_.end() && pending(it->second->last)) task->deps.push_back(it->second->last);
  }
  stream.queue_.push_back(task);
  stream.last = task;
  changed_.notify_all();
  return task;
}

void Runtime::waitTask(const TaskPtr& task) {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return task->done; });
}

bool Runtime::isDone(const TaskPtr& task) {
  std::lock_guard<std::mutex> lock(mutex_);
  return task->done;
}

unsigned Runtime::touchedMask() {
  std::lock_guard<std::mutex> lock(mutex_);
  return touched_;
}

long Runtime::implicitDevice0Calls() {
  std::lock_guard<std::mutex> lock(mutex_);
  return implicit_;
}

void Runtime::resetTouches() {
  std::lock_guard<std::mutex> lock(mutex_);
  touched_ = 0;
  implicit_ = 0;
}

long Runtime::counter(const char* name) {
  std::lock_guard<std::mutex> lock(mutex_);
  return counters_[name];
}

long Runtime::liveAllocations() {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<long>(device_.size());
}

Stream::Stream(Runtime& runtime, int physicalDevice, bool isBlocking, bool isLegacy)
    : device(physicalDevice), blocking(isBlocking), legacy(isLegacy), runtime_(runtime) {}

void Stream::start() {
  std::thread([self = shared_from_this()] { self->loop(); }).detach();
}

void Stream::retire() {
  std::lock_guard<std::mutex> lock(runtime_.mutex_);
  retired_ = true;
  runtime_.changed_.notify_all();
}

void Stream::loop() {
  std::unique_lock<std::mutex> lock(runtime_.mutex_);
  while (true) {
    runtime_.changed_.wait(lock, [&] { return !queue_.empty() || retired_; });
    if (queue_.empty()) return;  // retired and drained
    TaskPtr task = queue_.front();
    runtime_.changed_.wait(lock, [&] {
      for (const auto& dep : task->deps) {
        if (!dep->done) return false;
      }
      return true;
    });
    lock.unlock();
    task->run();
    lock.lock();
    task->done = true;
    task->deps.clear();
    task->run = nullptr;
    queue_.erase(queue_.begin());
    runtime_.changed_.notify_all();
  }
}

}  // namespace simgpu
