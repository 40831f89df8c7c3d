#include "worker_sdk/communicator.h"

#include <cstring>
#include <limits>
#include <vector>

#include "common/error.h"
#include "worker_sdk/backends.h"
#include "worker_sdk/flight_recorder.h"

namespace ddp {

namespace {

using ddprun::ConfigError;

void checkBuffers(const char* what, const void* send, const void* recv, std::size_t count, DataType type) {
  if (count == 0) return;
  if (!send || !recv) throw ConfigError(std::string(what) + ": null buffer");
  if (count > std::numeric_limits<std::size_t>::max() / 8 / elementSize(type)) {
    throw ConfigError(std::string(what) + ": " + std::to_string(count) + " elements is too many");
  }
}

// The default staging buffer: host memory, for backends whose collectives work on it.
class HostStagingBuffer final : public StagingBuffer {
 public:
  explicit HostStagingBuffer(std::size_t bytes) : StagingBuffer(bytes), bytes_(bytes) {}
  void* data() override { return bytes_.data(); }

 protected:
  void doCopyFromHost(const void* src, std::size_t bytes, std::size_t offset) override {
    std::memcpy(bytes_.data() + offset, src, bytes);
  }
  void doCopyToHost(void* dst, std::size_t bytes, std::size_t offset) override {
    std::memcpy(dst, bytes_.data() + offset, bytes);
  }

 private:
  std::vector<std::byte> bytes_;
};

}  // namespace

Backend parseBackend(std::string_view name) {
  if (name == "gloo") return Backend::kGloo;
  if (name == "nccl") return Backend::kNccl;
  throw ConfigError("unknown communicator backend '" + std::string(name) + "' (choose gloo or nccl)");
}

const char* toString(Backend backend) { return backend == Backend::kGloo ? "gloo" : "nccl"; }

bool isBackendAvailable(Backend backend) { return backend == Backend::kGloo || detail::ncclBuilt(); }

std::string whyBackendUnusable(Backend backend) {
  return backend == Backend::kGloo ? std::string() : detail::ncclUnusableReason();
}

std::unique_ptr<StagingBuffer> Communicator::makeStagingBuffer(std::size_t bytes) {
  return std::make_unique<HostStagingBuffer>(bytes);
}

void Communicator::allReduceHost(void* data, std::size_t count, DataType type, ReduceOp op) {
  if (memoryKind() == MemoryKind::kHost) {
    allReduce(data, data, count, type, op);
    return;
  }
  checkBuffers("allReduceHost", data, data, count, type);
  const std::size_t bytes = count * elementSize(type);
  auto staged = makeStagingBuffer(bytes);
  staged->copyFromHost(data, bytes, 0);
  allReduce(staged->data(), staged->data(), count, type, op);
  staged->copyToHost(data, bytes, 0);
}

Work Communicator::allReduceAsync(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op) {
  checkBuffers("allReduce", send, recv, count, type);
  return detail::recorded("all_reduce", count * elementSize(type),
                          [&] { return startAllReduce(send, recv, count, type, op); });
}

Work Communicator::broadcastAsync(const void* send, void* recv, std::size_t count, DataType type, int root) {
  if (root < 0 || root >= size()) {
    throw ConfigError("broadcast: root " + std::to_string(root) + " is not a rank of " + std::to_string(size()));
  }
  checkBuffers("broadcast", rank() == root ? send : recv, recv, count, type);
  return detail::recorded("broadcast", count * elementSize(type),
                          [&] { return startBroadcast(send, recv, count, type, root); });
}

Work Communicator::allGatherAsync(const void* send, void* recv, std::size_t sendCount, DataType type) {
  checkBuffers("allGather", send, recv, sendCount * static_cast<std::size_t>(size()), type);
  return detail::recorded("all_gather", sendCount * elementSize(type),
                          [&] { return startAllGather(send, recv, sendCount, type); });
}

Work Communicator::reduceScatterAsync(const void* send, void* recv, std::size_t recvCount, DataType type,
                                      ReduceOp op) {
  checkBuffers("reduceScatter", send, recv, recvCount * static_cast<std::size_t>(size()), type);
  return detail::recorded("reduce_scatter", recvCount * elementSize(type),
                          [&] { return startReduceScatter(send, recv, recvCount, type, op); });
}

Work Communicator::barrierAsync() {
  return detail::recorded("barrier", 0, [&] { return startBarrier(); });
}

void Communicator::allReduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op) {
  allReduceAsync(send, recv, count, type, op).wait();
}

void Communicator::broadcast(const void* send, void* recv, std::size_t count, DataType type, int root) {
  broadcastAsync(send, recv, count, type, root).wait();
}

void Communicator::allGather(const void* send, void* recv, std::size_t sendCount, DataType type) {
  allGatherAsync(send, recv, sendCount, type).wait();
}

void Communicator::reduceScatter(const void* send, void* recv, std::size_t recvCount, DataType type, ReduceOp op) {
  reduceScatterAsync(send, recv, recvCount, type, op).wait();
}

void Communicator::barrier() { barrierAsync().wait(); }

void Communicator::checkSpanSizes(std::size_t part, std::size_t whole, const char* what) const {
  if (whole != part * static_cast<std::size_t>(size())) throw ConfigError(what);
}

std::unique_ptr<Communicator> makeCommunicator(Backend backend, const Env& env, Store& store,
                                               const CommunicatorOptions& options) {
  if (env.worldSize < 1 || env.rank < 0 || env.rank >= env.worldSize) {
    throw ConfigError("rank " + std::to_string(env.rank) + " is not in a world of " + std::to_string(env.worldSize));
  }
  if (options.name.empty()) throw ConfigError("CommunicatorOptions::name must not be empty");
  switch (backend) {
    case Backend::kGloo: return detail::makeGlooCommunicator(env, store, options);
    case Backend::kNccl: return detail::makeNcclCommunicator(env, store, options);
  }
  throw ConfigError("unknown communicator backend");
}

namespace detail {

std::string keyPrefix(Backend backend, const CommunicatorOptions& options) {
  return std::string("ddp/") + toString(backend) + "/" + options.name + "/";
}

}  // namespace detail

}  // namespace ddp
