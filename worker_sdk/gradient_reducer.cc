#include "worker_sdk/gradient_reducer.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <mutex>

#include "common/error.h"

namespace ddp {

namespace {

struct Bucket {
  std::vector<std::size_t> gradients;     // indices, in packing order
  std::size_t elements = 0;               // floats packed
  std::unique_ptr<StagingBuffer> buffer;  // the packed values, where the communicator works
  std::size_t pending = 0;                // gradients not yet ready in this step
  Work work;                              // the all-reduce in flight
  bool started = false;
};

// Where a gradient lives in the buckets.
struct Slot {
  std::size_t bucket = 0;
  std::size_t offset = 0;  // in bytes
};

}  // namespace

struct GradientReducer::Impl {
  // The end of the last synchronized finish(): the next step's compute time runs from here.
  std::chrono::steady_clock::time_point lastFinishEnd{};
  // The compute times measured since the last takeStepSeconds().
  double stepSecondsSum = 0;
  long stepSecondsCount = 0;
  Impl(Communicator& c, std::vector<std::span<float>> g, GradientReducerOptions o)
      : comm(c), gradients(std::move(g)), options(o), ready(gradients.size(), false), slots(gradients.size()) {
    // Reverse registration order, closing a bucket once it reaches the cap, as DDP does.
    for (std::size_t i = gradients.size(); i-- > 0;) {
      if (buckets.empty() || buckets.back().elements * sizeof(float) >= options.bucketCapBytes) {
        buckets.emplace_back();
      }
      Bucket& bucket = buckets.back();
      slots[i] = Slot{buckets.size() - 1, bucket.elements * sizeof(float)};
      bucket.gradients.push_back(i);
      bucket.elements += gradients[i].size();
    }
    // The communicator decides where a bucket lives (host memory for gloo, its device for nccl).
    for (Bucket& bucket : buckets) bucket.buffer = comm.makeStagingBuffer(bucket.elements * sizeof(float));
    resetStep();
  }

  void resetStep() {
    std::fill(ready.begin(), ready.end(), false);
    for (Bucket& bucket : buckets) {
      bucket.pending = bucket.gradients.size();
      bucket.work = Work();
      bucket.started = false;
    }
    nextBucket = 0;
    marked = 0;
  }

  void markLocked(std::size_t index) {
    if (sync) {
      // Copied in now, while backward goes on (nccl: enqueued on the communicator's stream). First,
      // so that a failed copy leaves the gradient unmarked and finish() tries it again.
      const Slot slot = slots[index];
      buckets[slot.bucket].buffer->copyFromHost(gradients[index].data(), gradients[index].size_bytes(), slot.offset);
      --buckets[slot.bucket].pending;
    }
    ready[index] = true;
    ++marked;
    if (sync) startReadyBuckets();
  }

  // Starts buckets strictly in order: every rank must issue the same collectives in the same order.
  // A bucket counts as started only once its all-reduce was issued, so a failed start is retried.
  void startReadyBuckets() {
    while (nextBucket < buckets.size() && buckets[nextBucket].pending == 0) {
      Bucket& next = buckets[nextBucket];
      void* data = next.buffer->data();
      next.work = comm.allReduceAsync(data, data, next.elements, DataType::kFloat32,
                                      options.average ? ReduceOp::kAvg : ReduceOp::kSum);
      next.started = true;
      ++nextBucket;
    }
  }

  // Waits for every started bucket; returns the first error.
  std::exception_ptr waitAll() {
    std::exception_ptr first;
    for (Bucket& bucket : buckets) {
      if (!bucket.started) continue;
      try {
        bucket.work.wait();
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    return first;
  }

  Communicator& comm;
  const std::vector<std::span<float>> gradients;
  const GradientReducerOptions options;
  std::vector<Bucket> buckets;
  std::vector<bool> ready;
  std::vector<Slot> slots;
  std::size_t nextBucket = 0;
  std::size_t marked = 0;  // gradients marked in this step
  bool sync = true;
  mutable std::mutex mutex;
};

GradientReducer::GradientReducer(Communicator& comm, std::vector<std::span<float>> gradients,
                                 GradientReducerOptions options)
    : impl_(std::make_unique<Impl>(comm, std::move(gradients), options)) {}

GradientReducer::~GradientReducer() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->waitAll();
}

void GradientReducer::markReady(std::size_t index) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (index >= impl_->gradients.size()) {
    throw ddprun::ConfigError("markReady: no gradient " + std::to_string(index) + " (" +
                              std::to_string(impl_->gradients.size()) + " registered)");
  }
  if (impl_->ready[index]) {
    throw ddprun::StateError("markReady: gradient " + std::to_string(index) + " was already marked in this step");
  }
  impl_->markLocked(index);
}

void GradientReducer::finish() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  Impl& m = *impl_;
  if (!m.sync) {
    m.resetStep();
    return;
  }
  const auto entered = std::chrono::steady_clock::now();
  if (m.lastFinishEnd != std::chrono::steady_clock::time_point{}) {
    m.stepSecondsSum += std::chrono::duration<double>(entered - m.lastFinishEnd).count();
    ++m.stepSecondsCount;
  }
  std::exception_ptr error;
  try {
    for (std::size_t i = m.gradients.size(); i-- > 0;) {
      if (!m.ready[i]) m.markLocked(i);
    }
    m.startReadyBuckets();  // when a start failed in markReady() after every gradient was marked
  } catch (...) {
    error = std::current_exception();
  }
  std::exception_ptr waitError = m.waitAll();
  if (!error) error = waitError;
  if (!error) {
    // Every all-reduce completed (bounded by the communicator's timeout); the copies out are
    // ordered after them and return once the host holds the averages.
    try {
      for (std::size_t i = 0; i < m.gradients.size(); ++i) {
        const Slot slot = m.slots[i];
        m.buckets[slot.bucket].buffer->copyToHost(m.gradients[i].data(), m.gradients[i].size_bytes(), slot.offset);
      }
    } catch (...) {
      error = std::current_exception();
    }
  }
  m.resetStep();
  m.lastFinishEnd = std::chrono::steady_clock::now();
  if (error) std::rethrow_exception(error);
}

GradientReducer::NoSyncGuard GradientReducer::noSync() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (impl_->sync && impl_->marked > 0) {
    throw ddprun::StateError("noSync() inside a synchronized step: call finish() first");
  }
  const bool previous = impl_->sync;
  impl_->sync = false;
  return NoSyncGuard(*this, previous);
}

GradientReducer::NoSyncGuard::~NoSyncGuard() {
  std::lock_guard<std::mutex> lock(reducer_.impl_->mutex);
  Impl& m = *reducer_.impl_;
  // Leaving the outermost scope: marks of an unsynchronized step (without finish()) are dropped,
  // so the next step starts clean. Nothing of them is in flight.
  if (previous_ && !m.sync) m.resetStep();
  m.sync = previous_;
}

std::optional<double> GradientReducer::takeStepSeconds() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  Impl& m = *impl_;
  if (m.stepSecondsCount == 0) return std::nullopt;
  const double mean = m.stepSecondsSum / static_cast<double>(m.stepSecondsCount);
  m.stepSecondsSum = 0;
  m.stepSecondsCount = 0;
  return mean;
}

bool GradientReducer::syncEnabled() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->sync;
}

std::size_t GradientReducer::gradientCount() const { return impl_->gradients.size(); }

std::size_t GradientReducer::bucketCount() const { return impl_->buckets.size(); }

std::vector<std::size_t> GradientReducer::bucketGradients(std::size_t bucket) const {
  if (bucket >= impl_->buckets.size()) throw ddprun::ConfigError("no bucket " + std::to_string(bucket));
  return impl_->buckets[bucket].gradients;
}

}  // namespace ddp
