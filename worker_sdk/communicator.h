// Collectives between the ranks of a job, in the style of NCCL's communicator: one per rank, made
// by makeCommunicator() after the ranks agree through the job's Store. Backends: gloo (CPU, host
// memory, TCP) and nccl (GPU, device memory; present when libddp was built with CUDA and NCCL).
//
// Every rank must issue the same collectives, with the same sizes, in the same order. The
// asynchronous forms return a Work; buffers must stay valid and untouched until it completed.
// Operations of one communicator run in issue order. A failed or timed-out operation aborts the
// communicator: later operations fail at once with ddprun::StateError, so a restart of the group
// is never blocked by a hung peer.
//
// Buffers live where memoryKind() says (host for gloo, the device for nccl). Host-side code that
// must run on either stages its data through makeStagingBuffer(), or uses allReduceHost().
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "worker_sdk/data_type.h"
#include "worker_sdk/env.h"
#include "worker_sdk/staging_buffer.h"
#include "worker_sdk/store.h"
#include "worker_sdk/work.h"

namespace ddp {

enum class Backend { kGloo, kNccl };

// "gloo" or "nccl"; ddprun::ConfigError naming the choices otherwise.
Backend parseBackend(std::string_view name);
const char* toString(Backend backend);
// Whether this build of libddp has the backend (nccl: built with CUDA and NCCL).
bool isBackendAvailable(Backend backend);
// Why this process cannot use the backend, as a predicate to follow its name ("is not available:
// libddp was built without ...", "needs a CUDA device: <CUDA's message>"); empty when it can.
// Lets a program refuse a backend with one clear line before it joins the job.
std::string whyBackendUnusable(Backend backend);

struct CommunicatorOptions {
  // Bounds the bootstrap (store waits, connecting to peers) and every collective. PyTorch's
  // default process-group timeout.
  std::chrono::milliseconds timeout = std::chrono::minutes(30);
  // This communicator's namespace in the store: communicators made in one round need distinct
  // names, and every rank must use the same one.
  std::string name = "default";
  // gloo: the address to bind and advertise. Empty: the interface in GLOO_SOCKET_IFNAME, else the
  // local address that routes to MASTER_ADDR (loopback when MASTER_ADDR is this machine's
  // loopback), else the host name.
  std::string glooHostname;
  // nccl: the CUDA device. -1: LOCAL_RANK (ddprun --virtual_local_rank gives every worker
  // LOCAL_RANK=0 and only its own device). A local rank without a device of its own is a
  // ddprun::ConfigError: two local ranks never share a GPU.
  int device = -1;
  // How long the destructor lets operations already issued finish (a peer may still be on its
  // way to the last collective) before it aborts the communicator instead; at most `timeout`.
  std::chrono::milliseconds shutdownTimeout = std::chrono::seconds(5);
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Backend backend() const = 0;
  // Where the buffers of this communicator's collectives must live.
  virtual MemoryKind memoryKind() const { return MemoryKind::kHost; }
  // A buffer of `bytes` in memoryKind() memory whose copies from and to host memory are ordered
  // with this communicator's collectives; the backend alone decides how host data reaches its
  // collectives. Host memory by default (the copies are memcpy); nccl allocates on its device.
  virtual std::unique_ptr<StagingBuffer> makeStagingBuffer(std::size_t bytes);

  // recv[i] = op over ranks of send[i], for count elements. send may equal recv (in place).
  Work allReduceAsync(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op);
  // recv = root's send, for count elements; send is read on root only and may equal recv.
  Work broadcastAsync(const void* send, void* recv, std::size_t count, DataType type, int root);
  // recv (size() * sendCount elements) = every rank's send, in rank order. In place when send is
  // recv + rank() * sendCount elements.
  Work allGatherAsync(const void* send, void* recv, std::size_t sendCount, DataType type);
  // recv (recvCount elements) = this rank's block of op over ranks of send (size() * recvCount).
  Work reduceScatterAsync(const void* send, void* recv, std::size_t recvCount, DataType type, ReduceOp op);
  // Completes once every rank has called it.
  Work barrierAsync();

  // Synchronous forms: the asynchronous one, then wait().
  void allReduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op);
  void broadcast(const void* send, void* recv, std::size_t count, DataType type, int root);
  void allGather(const void* send, void* recv, std::size_t sendCount, DataType type);
  void reduceScatter(const void* send, void* recv, std::size_t recvCount, DataType type, ReduceOp op);
  void barrier();

  // In-place all-reduce of host memory on any backend: directly where memoryKind() is host, else
  // staged through a staging buffer (two copies). For small host values such as a loss sum.
  void allReduceHost(void* data, std::size_t count, DataType type, ReduceOp op);

  // Typed, in-place conveniences.
  template <typename T>
  Work allReduceAsync(std::span<T> data, ReduceOp op = ReduceOp::kSum) {
    return allReduceAsync(data.data(), data.data(), data.size(), dataTypeOf<T>(), op);
  }
  template <typename T>
  void allReduce(std::span<T> data, ReduceOp op = ReduceOp::kSum) {
    allReduceAsync(data, op).wait();
  }
  template <typename T>
  void broadcast(std::span<T> data, int root) {
    broadcast(data.data(), data.data(), data.size(), dataTypeOf<T>(), root);
  }
  // recv.size() must be size() * send.size().
  template <typename T>
  void allGather(std::span<const T> send, std::span<T> recv) {
    checkSpanSizes(send.size(), recv.size(), "allGather: recv must hold size() * send.size() elements");
    allGather(send.data(), recv.data(), send.size(), dataTypeOf<T>());
  }
  template <typename T>
  void allReduceHost(std::span<T> data, ReduceOp op = ReduceOp::kSum) {
    allReduceHost(data.data(), data.size(), dataTypeOf<T>(), op);
  }
  // send.size() must be size() * recv.size().
  template <typename T>
  void reduceScatter(std::span<const T> send, std::span<T> recv, ReduceOp op = ReduceOp::kSum) {
    checkSpanSizes(recv.size(), send.size(), "reduceScatter: send must hold size() * recv.size() elements");
    reduceScatter(send.data(), recv.data(), recv.size(), dataTypeOf<T>(), op);
  }

  // Fails pending and later operations and releases the peers (NCCL: ncclCommAbort). Never
  // blocks on a peer; safe from any thread.
  virtual void abort() = 0;

 protected:
  Communicator() = default;

  // The backend's work, called after the arguments were checked.
  virtual Work startAllReduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op) = 0;
  virtual Work startBroadcast(const void* send, void* recv, std::size_t count, DataType type, int root) = 0;
  virtual Work startAllGather(const void* send, void* recv, std::size_t sendCount, DataType type) = 0;
  virtual Work startReduceScatter(const void* send, void* recv, std::size_t recvCount, DataType type,
                                  ReduceOp op) = 0;
  virtual Work startBarrier() = 0;

 private:
  // ddprun::ConfigError unless whole == size() * part.
  void checkSpanSizes(std::size_t part, std::size_t whole, const char* what) const;
};

// Creates this rank's communicator: rank and size from env, bootstrap through store (used only
// during this call) under the keys "ddp/<backend>/<options.name>/". Blocks until every rank
// joined, up to options.timeout. Throws ddprun::ConfigError (backend not built, bad device),
// ddprun::TimeoutError (a rank did not come), ddprun::ConnectionError, ddprun::Error (NCCL/CUDA).
std::unique_ptr<Communicator> makeCommunicator(Backend backend, const Env& env, Store& store,
                                               const CommunicatorOptions& options = {});

}  // namespace ddp
