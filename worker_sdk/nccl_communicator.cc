// The NCCL backend (built when CMake finds CUDA and NCCL). The communicator is non-blocking
// (config.blocking = 0), so that its set-up and every operation can be bounded by the timeout:
// a hung peer or an asynchronous NCCL error ends in ncclCommAbort, never in a blocked restart.
//
// Operations are enqueued on the communicator's own non-blocking CUDA stream, after the work
// issued before them on the legacy default stream (where a plain CUDA program produces its
// buffers; one event, the host does not wait); work on other streams must be synchronized by the
// caller first. Later default-stream work is not held behind a collective in flight. Each
// operation records a CUDA event; a watchdog thread (nccl_state.h) polls every operation in
// flight and ncclCommGetAsyncError, and aborts the communicator when one fails or runs past the
// timeout, even when nobody waits; Work::wait() polls too, so it returns within microseconds.
//
// Staging buffers (for host-side callers such as GradientReducer) are device memory with a
// pinned host mirror, from a pool: a copy in is a memcpy into the mirror plus an asynchronous
// copy on the communicator's stream (it never waits for the stream, so it never waits for a
// slow peer), ordered before the next collective; a copy out is ordered after the last one and
// waited for, bounded by the timeout, so the host reads final values.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

#include "common/error.h"
#include "common/strings.h"
#include "worker_sdk/backends.h"
#include "worker_sdk/nccl_check.h"
#include "worker_sdk/nccl_state.h"
#include "worker_sdk/prefix_store.h"
#include "worker_sdk/unique_id_exchange.h"
#include "worker_sdk/work_state.h"

namespace ddp::detail {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

ncclDataType_t toNccl(DataType type) {
  switch (type) {
    case DataType::kFloat32: return ncclFloat32;
    case DataType::kFloat64: return ncclFloat64;
    case DataType::kInt32: return ncclInt32;
    case DataType::kInt64: return ncclInt64;
    case DataType::kFloat16: return ncclFloat16;
    case DataType::kBFloat16: return ncclBfloat16;
  }
  throw ddprun::ConfigError("unknown data type");
}

ncclRedOp_t toNccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kProduct: return ncclProd;
  }
  throw ddprun::ConfigError("unknown reduce op");
}

// Short sleeps first (a collective usually ends in microseconds), then at most 1 ms.
void backoff(int& round) {
  std::this_thread::sleep_for(std::chrono::microseconds(std::min(1000, 10 << std::min(round++, 7))));
}

// LOCAL_RANK, the device of this local rank. With --virtual_local_rank every worker has
// LOCAL_RANK=0 and sees only its own device, so that is device 0 there too. Fewer devices than
// local ranks is an error, never two local ranks on one GPU (NCCL would refuse it at init
// with "Duplicate GPU detected", or worse, oversubscribe it).
int chooseDevice(const Env& env, const CommunicatorOptions& options, int deviceCount) {
  if (deviceCount <= 0) {
    throw ddprun::ConfigError("backend 'nccl': no CUDA device is visible (cudaGetDeviceCount reports none)");
  }
  if (options.device >= 0) {
    if (options.device >= deviceCount) {
      throw ddprun::ConfigError("backend 'nccl': device " + std::to_string(options.device) + " does not exist (" +
                                std::to_string(deviceCount) + " visible)");
    }
    return options.device;
  }
  if (env.localRank >= deviceCount) {
    throw ddprun::ConfigError(
        "backend 'nccl': LOCAL_RANK=" + std::to_string(env.localRank) + " of LOCAL_WORLD_SIZE=" +
        std::to_string(env.localWorldSize) + " has no CUDA device of its own: " + std::to_string(deviceCount) +
        " visible (CUDA_VISIBLE_DEVICES='" + env.cudaVisibleDevices +
        "'); NCCL needs one device per local rank: make as many devices visible as local ranks, run fewer "
        "(--nproc_per_node), or give each worker its own device with ddprun --virtual_local_rank");
  }
  return env.localRank;
}

#ifndef DDP_NCCL_MIN_MAJOR  // set by worker_sdk/CMakeLists.txt from cmake/NcclVersion.cmake
#define DDP_NCCL_MIN_MAJOR 2
#define DDP_NCCL_MIN_MINOR 14
#endif

// The NCCL library loaded at run time may be older than the header libddp was built with (the
// machine's own libnccl): refuse one without the API this file relies on, with both versions,
// before a missing symbol ends the process.
void checkNcclVersion() {
  int code = 0;
  DDP_NCCL_CHECK(ncclGetVersion(&code), nullptr);
  // NCCL_VERSION(): major * 1000 + minor * 100 + patch up to 2.8, major * 10000 + ... since 2.9.
  const int major = code >= 10000 ? code / 10000 : code / 1000;
  const int minor = code >= 10000 ? (code % 10000) / 100 : (code % 1000) / 100;
  const int patch = code % 100;
  if (major < DDP_NCCL_MIN_MAJOR || (major == DDP_NCCL_MIN_MAJOR && minor < DDP_NCCL_MIN_MINOR)) {
    throw ddprun::ConfigError("backend 'nccl': the NCCL library loaded is " + std::to_string(major) + "." +
                              std::to_string(minor) + "." + std::to_string(patch) + ", libddp needs " +
                              std::to_string(DDP_NCCL_MIN_MAJOR) + "." + std::to_string(DDP_NCCL_MIN_MINOR) +
                              " or newer (built against " + std::to_string(NCCL_MAJOR) + "." +
                              std::to_string(NCCL_MINOR) + "." + std::to_string(NCCL_PATCH) + ")");
  }
}

class NcclWork final : public WorkState {
 public:
  NcclWork(std::shared_ptr<NcclState> state, std::shared_ptr<PendingOp> op)
      : state_(std::move(state)), op_(std::move(op)) {}

  // Polls the op (as the watchdog does) until it is done or failed; the deadline and abort are
  // the watchdog's, so a wait() never outlasts the timeout.
  void wait() override {
    int round = 0;
    while (!poll()) backoff(round);
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (op_->done) return;
    if (op_->timedOut) throw ddprun::TimeoutError(op_->error);
    throw ddprun::StateError(op_->error);
  }

  bool isCompleted() override { return poll(); }

 private:
  bool poll() {
    DeviceGuard onDevice(state_->device);  // never a query on device 0 from a helper thread
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->pollLocked(*op_);
  }

  std::shared_ptr<NcclState> state_;
  std::shared_ptr<PendingOp> op_;
};

// A pooled block on the communicator's device (see the file comment).
class NcclStagingBuffer final : public StagingBuffer {
 public:
  NcclStagingBuffer(std::shared_ptr<NcclState> state, std::size_t bytes)
      : StagingBuffer(bytes), state_(std::move(state)) {
    if (bytes == 0) return;
    block_ = state_->takeBlock(bytes);
    DeviceGuard onDevice(state_->device);
    const cudaError_t rc = cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming);
    if (rc != cudaSuccess) state_->giveBlock(block_);
    DDP_CUDA_CHECK(rc);
  }
  // Back to the pool, not cudaFree (which would synchronize the device): the next copy in or
  // collective on it is ordered on the same stream after everything issued on it so far.
  ~NcclStagingBuffer() override {
    if (copied_) {
      try {
        DeviceGuard onDevice(state_->device);
        cudaEventDestroy(copied_);
      } catch (...) {
      }
    }
    state_->giveBlock(block_);
  }

  void* data() override { return block_.device; }

 protected:
  void doCopyFromHost(const void* src, std::size_t bytes, std::size_t offset) override {
    checkUsable("copyFromHost");
    // The mirror's bytes at offset are free: the copy before it from there was ordered before
    // the last copyToHost(), which waited for it.
    std::memcpy(static_cast<std::byte*>(block_.host) + offset, src, bytes);
    DeviceGuard onDevice(state_->device);
    DDP_CUDA_CHECK(cudaMemcpyAsync(deviceAt(offset), static_cast<std::byte*>(block_.host) + offset, bytes,
                                   cudaMemcpyHostToDevice, state_->stream));
  }
  void doCopyToHost(void* dst, std::size_t bytes, std::size_t offset) override {
    checkUsable("copyToHost");
    {
      DeviceGuard onDevice(state_->device);
      DDP_CUDA_CHECK(cudaMemcpyAsync(static_cast<std::byte*>(block_.host) + offset, deviceAt(offset), bytes,
                                     cudaMemcpyDeviceToHost, state_->stream));
      DDP_CUDA_CHECK(cudaEventRecord(copied_, state_->stream));
    }
    waitCopied();
    std::memcpy(dst, static_cast<std::byte*>(block_.host) + offset, bytes);
  }

 private:
  std::byte* deviceAt(std::size_t offset) { return static_cast<std::byte*>(block_.device) + offset; }
  // An aborted communicator's buffers hold no result: fail as its collectives do.
  void checkUsable(const char* what) {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->aborted && !state_->destroyed) {
      throw ddprun::StateError(std::string("nccl staging ") + what + " refused: " + state_->failure);
    }
  }
  // The copy out, and everything before it on the stream, bounded by the timeout: past it the
  // communicator is aborted (what holds the stream up is a collective that cannot finish).
  void waitCopied() {
    const auto start = Clock::now();
    int round = 0;
    while (true) {
      {
        DeviceGuard onDevice(state_->device);
        const cudaError_t rc = cudaEventQuery(copied_);
        if (rc == cudaSuccess) break;
        if (rc != cudaErrorNotReady) DDP_CUDA_CHECK(rc);
      }
      std::lock_guard<std::mutex> lock(state_->mutex);
      if (state_->aborted && !state_->destroyed) {
        throw ddprun::StateError("nccl staging copyToHost: " + state_->failure);
      }
      if (Clock::now() - start >= state_->timeout) {
        const std::string msg = "nccl staging copyToHost (rank " + std::to_string(state_->rank) +
                                ") timed out after " + std::to_string(state_->timeout.count()) +
                                " ms behind the communicator's stream; the communicator was aborted";
        state_->abortLocked(msg);
        throw ddprun::TimeoutError(msg);
      }
      backoff(round);
    }
    std::lock_guard<std::mutex> lock(state_->mutex);
    // Aborted while the copy ran: its source may be a collective's unfinished output.
    if (state_->aborted && !state_->destroyed) throw ddprun::StateError("nccl staging copyToHost: " + state_->failure);
  }

  std::shared_ptr<NcclState> state_;  // keeps the stream and the pool alive as long as the buffer
  StagingBlock block_;
  cudaEvent_t copied_ = nullptr;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const Env& env, Store& store, const CommunicatorOptions& options)
      : rank_(env.rank), size_(env.worldSize), shutdownTimeout_(options.shutdownTimeout),
        state_(std::make_shared<NcclState>()) {
    state_->timeout = options.timeout;
    state_->rank = rank_;
    state_->size = size_;
    state_->device = chooseDevice(env, options, cudaDeviceCount());
    checkNcclVersion();
    // The constructing thread works on the communicator's device from now on.
    DDP_CUDA_CHECK(cudaSetDevice(state_->device));
    // Non-blocking: the legacy default stream (a program's compute) never waits for a collective
    // in flight; collectives wait for earlier default-stream work through `order` instead.
    DDP_CUDA_CHECK(cudaStreamCreateWithFlags(&state_->stream, cudaStreamNonBlocking));
    DDP_CUDA_CHECK(cudaEventCreateWithFlags(&state_->order, cudaEventDisableTiming));
    DDP_CUDA_CHECK(cudaMalloc(&state_->scratch, sizeof(int32_t)));

    const auto deadline = Clock::now() + options.timeout;
    PrefixStore prefixed(keyPrefix(Backend::kNccl, options), store);
    const std::string bytes = exchangeUniqueId(prefixed, rank_, "unique_id", options.timeout, newNcclUniqueId);
    ncclUniqueId id;
    if (bytes.size() != sizeof(id.internal)) {
      throw ddprun::StateError("the NCCL unique id in the store has " + std::to_string(bytes.size()) +
                               " bytes, not " + std::to_string(sizeof(id.internal)));
    }
    std::memcpy(id.internal, bytes.data(), bytes.size());

    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      try {
        DDP_NCCL_CHECK(ncclCommInitRankConfig(&state_->comm, size_, id, rank_, &config), state_->comm);
      } catch (const ddprun::Error& e) {
        state_->abortLocked(e.what());
        throw;
      }
    }
    state_->waitReady(deadline, "ncclCommInitRankConfig of rank " + std::to_string(rank_) + " of " +
                                    std::to_string(size_));
    state_->startWatchdog();
  }

  // Finishes what was issued and destroys the communicator; aborts it instead when it failed, or
  // when what was issued does not finish within shutdownTimeout (a peer that never joins a
  // collective must not hold a destructor for the whole collective timeout).
  ~NcclCommunicator() override {
    try {
      finalizeOrAbort();
    } catch (const std::exception& e) {
      state_->abort(std::string("destroying the communicator: ") + e.what());
    }
    state_->stopWatchdog();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Backend backend() const override { return Backend::kNccl; }
  MemoryKind memoryKind() const override { return MemoryKind::kDevice; }
  std::unique_ptr<StagingBuffer> makeStagingBuffer(std::size_t bytes) override {
    return std::make_unique<NcclStagingBuffer>(state_, bytes);
  }

  void abort() override { state_->abort("the communicator was aborted"); }

 protected:
  Work startAllReduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op) override {
    return enqueue("allReduce", [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclAllReduce(send, recv, count, toNccl(type), toNccl(op), comm, stream);
    });
  }

  Work startBroadcast(const void* send, void* recv, std::size_t count, DataType type, int root) override {
    return enqueue("broadcast", [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclBroadcast(send, recv, count, toNccl(type), root, comm, stream);
    });
  }

  Work startAllGather(const void* send, void* recv, std::size_t sendCount, DataType type) override {
    return enqueue("allGather", [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclAllGather(send, recv, sendCount, toNccl(type), comm, stream);
    });
  }

  Work startReduceScatter(const void* send, void* recv, std::size_t recvCount, DataType type,
                          ReduceOp op) override {
    return enqueue("reduceScatter", [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclReduceScatter(send, recv, recvCount, toNccl(type), toNccl(op), comm, stream);
    });
  }

  // NCCL has no barrier: an all-reduce of one int on the device.
  Work startBarrier() override {
    void* scratch = state_->scratch;
    return enqueue("barrier", [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclAllReduce(scratch, scratch, 1, ncclInt32, ncclSum, comm, stream);
    });
  }

 private:
  // Everything that can fail before NCCL is called happens first (event creation, ordering):
  // a failed start leaves nothing in flight, so a caller may retry it. Once the collective is
  // enqueued, a failure to track it aborts the communicator: an untracked collective would pair
  // with the peers' next one.
  template <typename Call>
  Work enqueue(const std::string& name, Call call) {
    DeviceGuard onDevice(state_->device);
    auto op = std::make_shared<PendingOp>();
    op->device = state_->device;
    DDP_CUDA_CHECK(cudaEventCreateWithFlags(&op->event, cudaEventDisableTiming));
    std::string what;
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      if (state_->aborted) throw ddprun::StateError("nccl " + name + " refused: " + state_->failure);
      what = op->what = state_->describe(name, ++state_->issued);
      // After the default stream's earlier work (the buffers' producer), without holding the host.
      DDP_CUDA_CHECK(cudaEventRecord(state_->order, cudaStreamLegacy));
      DDP_CUDA_CHECK(cudaStreamWaitEvent(state_->stream, state_->order, 0));
      try {
        DDP_NCCL_CHECK(call(state_->comm, state_->stream), state_->comm);
      } catch (const ddprun::Error& e) {
        state_->abortLocked(e.what());
        throw;
      }
    }
    state_->waitReady(Clock::now() + state_->timeout, what);  // a non-blocking communicator may still be enqueuing
    std::lock_guard<std::mutex> lock(state_->mutex);
    const cudaError_t rc = cudaEventRecord(op->event, state_->stream);
    if (rc != cudaSuccess) {
      const std::string msg = "nccl " + what + ": cudaEventRecord: " + cudaGetErrorName(rc) +
                              "; the collective cannot be tracked, the communicator was aborted";
      state_->abortLocked(msg);
      throw ddprun::Error(msg);
    }
    op->start = Clock::now();
    op->deadline = op->start + state_->timeout;
    state_->trackLocked(op);
    return Work(std::make_shared<NcclWork>(state_, op));
  }

  void finalizeOrAbort() {
    const auto deadline = Clock::now() + std::min(state_->timeout, shutdownTimeout_);
    DeviceGuard onDevice(state_->device);
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      if (!state_->comm || state_->aborted) return;
      const ncclResult_t rc = ncclCommFinalize(state_->comm);
      if (rc != ncclSuccess && rc != ncclInProgress) {
        state_->abortLocked(std::string("ncclCommFinalize: ") + ncclGetErrorString(rc));
        return;
      }
    }
    try {
      state_->waitReady(deadline, "ncclCommFinalize");
    } catch (const std::exception&) {
      return;  // waitReady aborted it
    }
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->aborted) return;
    ncclCommDestroy(state_->comm);
    state_->aborted = true;
    state_->destroyed = true;
    state_->failure = "the communicator was destroyed";
  }

  const int rank_;
  const int size_;
  const milliseconds shutdownTimeout_;
  std::shared_ptr<NcclState> state_;
};

}  // namespace

bool ncclBuilt() { return true; }

std::unique_ptr<Communicator> makeNcclCommunicator(const Env& env, Store& store, const CommunicatorOptions& options) {
  return std::make_unique<NcclCommunicator>(env, store, options);
}

std::string newNcclUniqueId() {
  ncclUniqueId id;
  DDP_NCCL_CHECK(ncclGetUniqueId(&id), nullptr);
  return std::string(id.internal, sizeof(id.internal));
}

std::string ncclUnusableReason() {
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error
    return std::string("needs a CUDA device: ") + cudaGetErrorString(rc) + " (cudaGetDeviceCount: " +
           cudaGetErrorName(rc) + ")";
  }
  if (count == 0) return "needs a CUDA device: cudaGetDeviceCount reports none";
  return "";
}

int cudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return count;
}

}  // namespace ddp::detail
