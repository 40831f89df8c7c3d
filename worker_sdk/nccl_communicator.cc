// The NCCL backend (built when CMake finds CUDA and NCCL). The communicator is non-blocking
// (config.blocking = 0), so that its set-up and every operation can be bounded by the timeout:
// a hung peer or an asynchronous NCCL error ends in ncclCommAbort, never in a blocked restart.
//
// Operations are enqueued on the communicator's own CUDA stream (ordered with the legacy default
// stream; work on other streams must be synchronized by the caller first); a Work records a CUDA
// event and its wait() polls that event and ncclCommGetAsyncError until done, failed or past the
// deadline, so wait() blocks the host, not a stream.
//
// Staging buffers (for host-side callers such as GradientReducer) are device memory whose copies
// are enqueued on that same stream: a copy in is ordered before the next collective, and a copy
// out after the last one, then synchronized, so the host reads final values.
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

// LOCAL_RANK, or 0 when CUDA_VISIBLE_DEVICES names one device (ddprun --virtual_local_rank).
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
  if (!env.cudaVisibleDevices.empty() && ddprun::split(env.cudaVisibleDevices, ',').size() == 1) return 0;
  if (env.localRank >= deviceCount) {
    throw ddprun::ConfigError("LOCAL_RANK=" + std::to_string(env.localRank) + " has no CUDA device: " +
                              std::to_string(deviceCount) + " visible (CUDA_VISIBLE_DEVICES='" +
                              env.cudaVisibleDevices + "')");
  }
  return env.localRank;
}

// ncclGetLastError, never null.
std::string lastError(ncclComm_t comm) {
  const char* text = ncclGetLastError(comm);
  return text ? text : "";
}

// Makes `device` current on the calling thread for one call, then restores the thread's own.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    DDP_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) DDP_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

// What the communicator and its Works share: the NCCL communicator may only be touched under
// mutex, and once aborted, never again.
struct NcclState {
  ~NcclState() {
    if (scratch) cudaFree(scratch);
    if (stream) cudaStreamDestroy(stream);
  }

  // Records why the communicator is unusable and aborts it, once.
  void abortLocked(const std::string& why) {
    if (failure.empty()) failure = why;
    if (comm && !aborted) {
      ncclCommAbort(comm);
      aborted = true;
    }
  }
  void abort(const std::string& why) {
    std::lock_guard<std::mutex> lock(mutex);
    abortLocked(why);
  }

  // Polls until the communicator is no longer ncclInProgress; aborts on an error or at deadline.
  void waitReady(Clock::time_point deadline, const std::string& what) {
    int round = 0;
    while (true) {
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (aborted) throw ddprun::StateError("nccl " + what + ": " + failure);
        ncclResult_t state = ncclSuccess;
        const ncclResult_t rc = ncclCommGetAsyncError(comm, &state);
        if (rc != ncclSuccess) state = rc;
        if (state == ncclSuccess) return;
        if (state != ncclInProgress) {
          const std::string msg = std::string("nccl ") + what + ": " + ncclGetErrorString(state) + " (" +
                                  lastError(comm) + ")";
          abortLocked(msg);
          throw ddprun::Error(msg);
        }
        if (Clock::now() >= deadline) {
          const std::string msg = "nccl " + what + " timed out";
          abortLocked(msg);
          throw ddprun::TimeoutError(msg);
        }
      }
      backoff(round);
    }
  }

  std::mutex mutex;
  ncclComm_t comm = nullptr;
  bool aborted = false;    // comm is gone: aborted, or destroyed
  bool destroyed = false;  // destroyed cleanly, after every operation finished
  std::string failure;  // empty while healthy
  int device = 0;
  cudaStream_t stream = nullptr;
  void* scratch = nullptr;  // one int32 for barrier()
  milliseconds timeout{0};
};

class NcclWork final : public WorkState {
 public:
  NcclWork(std::shared_ptr<NcclState> state, cudaEvent_t event, std::string what)
      : state_(std::move(state)), event_(event), what_(std::move(what)), deadline_(Clock::now() + state_->timeout) {}
  ~NcclWork() override { cudaEventDestroy(event_); }

  void wait() override {
    if (succeeded_) return;
    int round = 0;
    while (true) {
      const cudaError_t rc = cudaEventQuery(event_);
      if (rc == cudaSuccess) {
        std::lock_guard<std::mutex> lock(state_->mutex);
        // An abort ends the kernels too: their output is not a result.
        if (state_->aborted && !state_->destroyed) throw ddprun::StateError("nccl " + what_ + ": " + state_->failure);
        succeeded_ = true;
        return;
      }
      if (rc != cudaErrorNotReady) {
        const std::string msg = "nccl " + what_ + ": " + cudaGetErrorString(rc);
        state_->abort(msg);
        throw ddprun::Error(msg);
      }
      {
        std::lock_guard<std::mutex> lock(state_->mutex);
        if (state_->aborted) throw ddprun::StateError("nccl " + what_ + ": " + state_->failure);
        ncclResult_t async = ncclSuccess;
        ncclCommGetAsyncError(state_->comm, &async);
        if (async != ncclSuccess && async != ncclInProgress) {
          const std::string msg = "nccl " + what_ + ": " + ncclGetErrorString(async) + " (" +
                                  lastError(state_->comm) + ")";
          state_->abortLocked(msg);
          throw ddprun::Error(msg);
        }
        if (Clock::now() >= deadline_) {
          const std::string msg = "nccl " + what_ + " timed out after " + std::to_string(state_->timeout.count()) +
                                  " ms; the communicator was aborted";
          state_->abortLocked(msg);
          throw ddprun::TimeoutError(msg);
        }
      }
      backoff(round);
    }
  }

  bool isCompleted() override {
    if (cudaEventQuery(event_) != cudaErrorNotReady) return true;
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->aborted;
  }

 private:
  std::shared_ptr<NcclState> state_;
  cudaEvent_t event_;
  const std::string what_;
  const Clock::time_point deadline_;
  std::atomic<bool> succeeded_{false};  // seen complete before any abort
};

// Device memory on the communicator's device; copies run on its stream (see the file comment).
class NcclStagingBuffer final : public StagingBuffer {
 public:
  NcclStagingBuffer(std::shared_ptr<NcclState> state, std::size_t bytes)
      : StagingBuffer(bytes), state_(std::move(state)) {
    if (bytes == 0) return;
    DeviceGuard onDevice(state_->device);
    DDP_CUDA_CHECK(cudaMalloc(&data_, bytes));
  }
  // cudaFree waits for work still using the buffer; an aborted communicator has ended its kernels.
  ~NcclStagingBuffer() override {
    if (data_) cudaFree(data_);
  }

  void* data() override { return data_; }

 protected:
  void doCopyFromHost(const void* src, std::size_t bytes, std::size_t offset) override {
    checkUsable("copyFromHost");
    DeviceGuard onDevice(state_->device);
    DDP_CUDA_CHECK(cudaMemcpyAsync(at(offset), src, bytes, cudaMemcpyHostToDevice, state_->stream));
  }
  void doCopyToHost(void* dst, std::size_t bytes, std::size_t offset) override {
    checkUsable("copyToHost");
    DeviceGuard onDevice(state_->device);
    DDP_CUDA_CHECK(cudaMemcpyAsync(dst, at(offset), bytes, cudaMemcpyDeviceToHost, state_->stream));
    // Also the completion of every earlier copy in, whose host source may be reused from now on.
    DDP_CUDA_CHECK(cudaStreamSynchronize(state_->stream));
  }

 private:
  std::byte* at(std::size_t offset) { return static_cast<std::byte*>(data_) + offset; }
  // An aborted communicator's buffers hold no result: fail as its collectives do.
  void checkUsable(const char* what) {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->aborted && !state_->destroyed) {
      throw ddprun::StateError(std::string("nccl staging ") + what + " refused: " + state_->failure);
    }
  }

  std::shared_ptr<NcclState> state_;  // keeps the stream alive as long as the buffer
  void* data_ = nullptr;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const Env& env, Store& store, const CommunicatorOptions& options)
      : rank_(env.rank), size_(env.worldSize), state_(std::make_shared<NcclState>()) {
    state_->timeout = options.timeout;
    state_->device = chooseDevice(env, options, cudaDeviceCount());
    DDP_CUDA_CHECK(cudaSetDevice(state_->device));
    // A blocking stream: ordered with the legacy default stream, where a plain CUDA program
    // produces its gradients, so no extra synchronization is needed before a collective.
    DDP_CUDA_CHECK(cudaStreamCreate(&state_->stream));
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
  }

  // Finishes what was issued (bounded by the timeout) and destroys the communicator; aborts it
  // instead when it failed or a peer holds it up.
  ~NcclCommunicator() override {
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
      state_->waitReady(Clock::now() + state_->timeout, "ncclCommFinalize");
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
  template <typename Call>
  Work enqueue(const std::string& what, Call call) {
    const auto deadline = Clock::now() + state_->timeout;
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      if (state_->aborted) throw ddprun::StateError("nccl " + what + " refused: " + state_->failure);
      DeviceGuard onDevice(state_->device);
      try {
        DDP_NCCL_CHECK(call(state_->comm, state_->stream), state_->comm);
      } catch (const ddprun::Error& e) {
        state_->abortLocked(e.what());
        throw;
      }
    }
    state_->waitReady(deadline, what);  // a non-blocking communicator may still be enqueuing
    DeviceGuard onDevice(state_->device);  // the event must belong to the stream's device
    cudaEvent_t event = nullptr;
    DDP_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    const cudaError_t rc = cudaEventRecord(event, state_->stream);
    if (rc != cudaSuccess) cudaEventDestroy(event);
    DDP_CUDA_CHECK(rc);
    return Work(std::make_shared<NcclWork>(state_, event, what));
  }

  const int rank_;
  const int size_;
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
