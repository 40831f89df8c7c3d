#include "worker_sdk/nccl_state.h"

#include <algorithm>

#include "common/error.h"
#include "worker_sdk/nccl_check.h"

namespace ddp::detail {

namespace {

using std::chrono::milliseconds;

std::string lastError(ncclComm_t comm) {
  const char* text = ncclGetLastError(comm);
  return text ? text : "";
}

long long elapsedMs(NcclClock::time_point since) {
  return std::chrono::duration_cast<milliseconds>(NcclClock::now() - since).count();
}

// Runs f with `device` current; never throws (destructors).
template <typename F>
void onDeviceNoThrow(int device, F f) noexcept {
  try {
    DeviceGuard onDevice(device);
    f();
  } catch (...) {
  }
}

}  // namespace

DeviceGuard::DeviceGuard(int device) {
  DDP_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) {
    DDP_CUDA_CHECK(cudaSetDevice(device));
    restore_ = previous_ != 0;  // see the class comment
  }
}

DeviceGuard::~DeviceGuard() {
  if (restore_) cudaSetDevice(previous_);
}

PendingOp::~PendingOp() {
  if (event) onDeviceNoThrow(device, [&] { cudaEventDestroy(event); });
}

NcclState::~NcclState() {
  stopWatchdog();
  onDeviceNoThrow(device, [&] {
    for (auto& [capacity, block] : freeBlocks) {
      cudaFree(block.device);
      cudaFreeHost(block.host);
    }
    if (scratch) cudaFree(scratch);
    if (order) cudaEventDestroy(order);
    if (stream) cudaStreamDestroy(stream);
  });
}

void NcclState::abortLocked(const std::string& why) {
  if (failure.empty()) failure = why;
  if (comm && !aborted) {
    ncclCommAbort(comm);
    aborted = true;
  }
  // The abort ended every kernel: what was in flight holds no result.
  for (auto& op : pending) {
    if (op->done || op->failed) continue;
    op->failed = true;
    op->error = "nccl " + op->what + " failed after " + std::to_string(elapsedMs(op->start)) + " ms: " + failure;
  }
  pending.clear();
  wake_.notify_all();
}

void NcclState::abort(const std::string& why) {
  std::lock_guard<std::mutex> lock(mutex);
  abortLocked(why);
}

void NcclState::waitReady(NcclClock::time_point deadline, const std::string& what) {
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
      if (NcclClock::now() >= deadline) {
        const std::string msg = "nccl " + what + " timed out";
        abortLocked(msg);
        throw ddprun::TimeoutError(msg);
      }
    }
    // Short sleeps first (a call usually ends in microseconds), then at most 1 ms.
    std::this_thread::sleep_for(std::chrono::microseconds(std::min(1000, 10 << std::min(round++, 7))));
  }
}

bool NcclState::pollLocked(PendingOp& op) {
  if (op.done || op.failed) return true;
  if (aborted) {
    // A clean destroy finalized first: what was issued ran and holds its result. Its event may
    // complete an instant after the finalize returned (the stream reaches it after the kernel),
    // so a not-ready event is waited for, up to the op's deadline, not failed.
    if (destroyed) {
      const cudaError_t rc = cudaEventQuery(op.event);
      if (rc == cudaSuccess) {
        op.done = true;
        return true;
      }
      if (rc == cudaErrorNotReady && NcclClock::now() < op.deadline) return false;
    }
    op.failed = true;
    op.error = "nccl " + op.what + ": " + failure;
    return true;
  }
  auto failWith = [&](std::string msg, bool timedOut) {
    op.failed = true;
    op.timedOut = timedOut;
    op.error = msg;
    abortLocked(msg);
    return true;
  };
  const cudaError_t rc = cudaEventQuery(op.event);
  if (rc == cudaSuccess) {
    op.done = true;
    return true;
  }
  if (rc != cudaErrorNotReady) {
    return failWith("nccl " + op.what + ": " + cudaGetErrorName(rc) + ": " + cudaGetErrorString(rc) +
                        "; the communicator was aborted",
                    false);
  }
  ncclResult_t async = ncclSuccess;
  ncclCommGetAsyncError(comm, &async);
  if (async != ncclSuccess && async != ncclInProgress) {
    return failWith("nccl " + op.what + ": " + ncclGetErrorString(async) + " (" + lastError(comm) + ") after " +
                        std::to_string(elapsedMs(op.start)) + " ms; the communicator was aborted",
                    false);
  }
  if (NcclClock::now() >= op.deadline) {
    return failWith("nccl " + op.what + " timed out: not complete after " + std::to_string(elapsedMs(op.start)) +
                        " ms (timeout " + std::to_string(timeout.count()) + " ms); the communicator was aborted",
                    true);
  }
  return false;
}

void NcclState::trackLocked(const std::shared_ptr<PendingOp>& op) {
  pending.push_back(op);
  wake_.notify_all();
}

void NcclState::startWatchdog() {
  watchdog_ = std::thread([this] { watchdogLoop(); });
}

void NcclState::stopWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex);
    stopping_ = true;
    wake_.notify_all();
  }
  if (watchdog_.joinable()) watchdog_.join();
}

void NcclState::watchdogLoop() {
  // Its own device, first: an event query on a thread without one would make a context on
  // device 0.
  if (cudaSetDevice(device) != cudaSuccess) {
    abort("the NCCL watchdog cannot select device " + std::to_string(device));
    return;
  }
  std::unique_lock<std::mutex> lock(mutex);
  while (!stopping_) {
    // A copy: a failure aborts the communicator, which clears `pending`.
    const auto ops = pending;
    for (const auto& op : ops) {
      if (aborted) break;
      pollLocked(*op);
    }
    std::erase_if(pending, [](const auto& op) { return op->done || op->failed; });
    // Often enough that a timeout is met within milliseconds, rarely when idle.
    wake_.wait_for(lock, pending.empty() ? milliseconds(200) : milliseconds(2));
  }
}

StagingBlock NcclState::takeBlock(std::size_t bytes) {
  const std::size_t capacity = std::max<std::size_t>(256, (bytes + 255) / 256 * 256);
  {
    std::lock_guard<std::mutex> lock(mutex);
    // The smallest free block that fits, unless it would waste more than half of itself.
    auto it = freeBlocks.lower_bound(capacity);
    if (it != freeBlocks.end() && it->first <= 2 * capacity) {
      StagingBlock block = it->second;
      freeBlocks.erase(it);
      return block;
    }
  }
  StagingBlock block;
  block.capacity = capacity;
  DeviceGuard onDevice(device);
  DDP_CUDA_CHECK(cudaMalloc(&block.device, capacity));
  const cudaError_t rc = cudaHostAlloc(&block.host, capacity, cudaHostAllocDefault);
  if (rc != cudaSuccess) cudaFree(block.device);
  DDP_CUDA_CHECK(rc);
  return block;
}

void NcclState::giveBlock(StagingBlock block) {
  if (!block.device) return;
  std::lock_guard<std::mutex> lock(mutex);
  freeBlocks.emplace(block.capacity, block);
}

std::string NcclState::describe(const std::string& what, long seq) const {
  return what + " #" + std::to_string(seq) + " (rank " + std::to_string(rank) + " of " + std::to_string(size) +
         ", device " + std::to_string(device) + ")";
}

}  // namespace ddp::detail
