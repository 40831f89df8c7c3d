// The gloo backend: CPU collectives over TCP with Debian's libgloo. gloo's algorithms are
// synchronous; each runs on this communicator's worker thread, in issue order, so the
// asynchronous forms never reorder collectives between ranks.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "common/error.h"
#include "common/net.h"
#include "common/strings.h"
#include "worker_sdk/backends.h"
#include "worker_sdk/gloo_store_adapter.h"
#include "worker_sdk/host_reduce.h"
#include "worker_sdk/prefix_store.h"
#include "worker_sdk/serial_executor.h"
#include "worker_sdk/source_address.h"
#include "worker_sdk/work_state.h"

namespace ddp::detail {

namespace {

using std::chrono::milliseconds;

// gloo reports timeouts as IoException("... Timed out ..."); everything else it throws is an I/O
// failure or a broken invariant.
[[noreturn]] void rethrowGloo(const std::string& what) {
  try {
    throw;
  } catch (const ddprun::Error&) {
    throw;
  } catch (const gloo::IoException& e) {
    const std::string msg = std::string(e.what());
    if (msg.find("imed out") != std::string::npos) throw ddprun::TimeoutError("gloo " + what + ": " + msg);
    throw ddprun::ConnectionError("gloo " + what + ": " + msg);
  } catch (const std::exception& e) {
    throw ddprun::Error("gloo " + what + ": " + e.what());
  }
}

gloo::transport::tcp::attr deviceAttr(const Env& env, const CommunicatorOptions& options) {
  gloo::transport::tcp::attr attr;
  if (options.glooHostname.empty() && !env.glooSocketIfname.empty()) {
    attr.iface = ddprun::split(env.glooSocketIfname, ',').front();  // PyTorch accepts a list
    return attr;
  }
  const std::string host = !options.glooHostname.empty()
                               ? options.glooHostname
                               : sourceAddressToward(env.masterAddr, env.masterPort).value_or(ddprun::hostName());
  // Numeric only: gloo's own failed lookup reads an uninitialized pointer.
  auto numeric = numericAddress(host);
  if (!numeric) throw ddprun::ConfigError("gloo: cannot resolve the address '" + host + "' to bind");
  attr.hostname = *numeric;
  return attr;
}

// Sets a gloo options object's output to count elements of elementBytes each: gloo moves bytes,
// the reduce function knows the type.
template <typename Options>
void setOutput(Options& opts, void* data, std::size_t count, std::size_t elementBytes) {
  switch (elementBytes) {
    case 2: opts.template setOutput<uint16_t>(static_cast<uint16_t*>(data), count); return;
    case 4: opts.template setOutput<uint32_t>(static_cast<uint32_t*>(data), count); return;
    case 8: opts.template setOutput<uint64_t>(static_cast<uint64_t*>(data), count); return;
  }
  throw ddprun::ConfigError("unsupported element size " + std::to_string(elementBytes));
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(const Env& env, Store& store, const CommunicatorOptions& options)
      : rank_(env.rank), size_(env.worldSize), timeout_(options.timeout) {
    const auto attr = deviceAttr(env, options);
    try {
      device_ = gloo::transport::tcp::CreateDevice(attr);
    } catch (...) {
      rethrowGloo("cannot use address '" + (attr.iface.empty() ? attr.hostname : "interface " + attr.iface) + "'");
    }
    PrefixStore prefixed(keyPrefix(Backend::kGloo, options), store);
    GlooStoreAdapter adapter(prefixed, timeout_);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
    context->setTimeout(timeout_);
    try {
      context->connectFullMesh(adapter, device_);
    } catch (...) {
      rethrowGloo("connecting rank " + std::to_string(rank_) + " of " + std::to_string(size_));
    }
    context_ = std::move(context);
  }

  ~GlooCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (failure_.empty()) failure_ = "the communicator was destroyed";
    }
    executor_.reset();  // queued operations fail at once; one in flight ends by its timeout
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Backend backend() const override { return Backend::kGloo; }

  void abort() override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failure_.empty()) failure_ = "the communicator was aborted";
  }

 protected:
  Work startAllReduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op) override {
    return submit("allReduce", [=, this](uint32_t tag) { allReduce(send, recv, count, type, op, tag); });
  }

  Work startBroadcast(const void* send, void* recv, std::size_t count, DataType type, int root) override {
    return submit("broadcast", [=, this](uint32_t tag) {
      const std::size_t bytes = count * elementSize(type);
      if (rank_ == root && send != recv && bytes) std::memmove(recv, send, bytes);
      if (size_ == 1 || bytes == 0) return;
      gloo::BroadcastOptions opts(context_);
      setOutput(opts, recv, count, elementSize(type));
      opts.setRoot(root);
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      gloo::broadcast(opts);
    });
  }

  Work startAllGather(const void* send, void* recv, std::size_t sendCount, DataType type) override {
    return submit("allGather", [=, this](uint32_t tag) {
      const std::size_t bytes = sendCount * elementSize(type);
      char* mine = static_cast<char*>(recv) + static_cast<std::size_t>(rank_) * bytes;
      if (send != mine && bytes) std::memmove(mine, send, bytes);
      if (size_ == 1 || bytes == 0) return;
      gloo::AllgatherOptions opts(context_);
      setOutput(opts, recv, sendCount * static_cast<std::size_t>(size_), elementSize(type));
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      gloo::allgather(opts);
    });
  }

  // gloo has no reduce-scatter of this style: all-reduce a copy, keep this rank's block.
  Work startReduceScatter(const void* send, void* recv, std::size_t recvCount, DataType type,
                          ReduceOp op) override {
    return submit("reduceScatter", [=, this](uint32_t tag) {
      const std::size_t blockBytes = recvCount * elementSize(type);
      std::vector<char> whole(blockBytes * static_cast<std::size_t>(size_));
      if (blockBytes) std::memcpy(whole.data(), send, whole.size());
      allReduce(whole.data(), whole.data(), recvCount * static_cast<std::size_t>(size_), type, op, tag);
      if (blockBytes) std::memcpy(recv, whole.data() + static_cast<std::size_t>(rank_) * blockBytes, blockBytes);
    });
  }

  Work startBarrier() override {
    return submit("barrier", [this](uint32_t tag) {
      if (size_ == 1) return;
      gloo::BarrierOptions opts(context_);
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      gloo::barrier(opts);
    });
  }

 private:
  // Runs on the worker thread.
  void allReduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, uint32_t tag) {
    const std::size_t bytes = count * elementSize(type);
    if (send != recv && bytes) std::memmove(recv, send, bytes);
    if (bytes == 0) return;
    if (size_ > 1) {
      gloo::AllreduceOptions opts(context_);
      setOutput(opts, recv, count, elementSize(type));
      opts.setReduceFunction(hostReduceFunction(type, op));
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      gloo::allreduce(opts);
    }
    if (op == ReduceOp::kAvg) divideInPlace(recv, count, type, size_);
  }

  // Queues op for the worker thread. A failure (or an abort) before it runs fails it at once; a
  // failure while it runs fails it and every later operation.
  Work submit(const char* what, std::function<void(uint32_t tag)> op) {
    auto work = std::make_shared<PromiseWork>();
    executor_->submit([this, what, work, op = std::move(op)] {
      const uint32_t tag = nextTag_++;  // the same sequence on every rank: operations run in issue order
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!failure_.empty()) {
          work->complete(std::make_exception_ptr(
              ddprun::StateError(std::string("gloo ") + what + " refused: " + failure_)));
          return;
        }
      }
      try {
        try {
          op(tag);
        } catch (...) {
          rethrowGloo(what);
        }
        work->complete(nullptr);
      } catch (const std::exception& e) {
        {
          std::lock_guard<std::mutex> lock(mutex_);
          if (failure_.empty()) failure_ = std::string("an earlier operation failed: ") + e.what();
        }
        work->complete(std::current_exception());
      }
    });
    return Work(work);
  }

  const int rank_;
  const int size_;
  const milliseconds timeout_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  std::mutex mutex_;
  std::string failure_;  // empty while healthy
  uint32_t nextTag_ = 0;  // worker thread only
  // Last: destroyed (joined) first, while everything its tasks use still exists.
  std::unique_ptr<SerialExecutor> executor_ = std::make_unique<SerialExecutor>();
};

}  // namespace

std::unique_ptr<Communicator> makeGlooCommunicator(const Env& env, Store& store, const CommunicatorOptions& options) {
  return std::make_unique<GlooCommunicator>(env, store, options);
}

}  // namespace ddp::detail
