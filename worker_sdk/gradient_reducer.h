// Data-parallel gradient averaging, as PyTorch's DistributedDataParallel reducer: gradients are
// packed into buckets of about bucketCapBytes, in reverse registration order (the order backward
// produces them); a bucket's all-reduce starts as soon as all its gradients are marked ready, so
// communication overlaps the rest of the backward pass; finish() waits for every bucket and
// writes the averages back. Inside a noSync() scope nothing is communicated: gradients accumulate
// locally, and the next synchronized step all-reduces the accumulated sums.
//
// Gradients are spans of float in host memory, on any backend: each bucket is a staging buffer
// the communicator makes (host memory for gloo; device memory for nccl, where a gradient is copied
// in when marked ready and the averages are copied back in finish()). Every rank must register the
// same gradients with the same sizes. Thread-safe: markReady() may come from several threads.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "worker_sdk/communicator.h"

namespace ddp {

struct GradientReducerOptions {
  // DDP's bucket_cap_mb = 25. A bucket closes once it holds at least this many bytes, so one
  // large gradient makes a bucket of its own.
  std::size_t bucketCapBytes = 25 * 1024 * 1024;
  // Divide the sum by the world size (DDP); false leaves the sum.
  bool average = true;
};

class GradientReducer {
 public:
  // `comm` and the gradients' memory must outlive the reducer. Allocates the buckets' staging
  // buffers (ddprun::Error when the backend cannot, e.g. out of device memory).
  GradientReducer(Communicator& comm, std::vector<std::span<float>> gradients, GradientReducerOptions options = {});
  // Waits for buckets still in flight (their errors are dropped).
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Gradient `index` (registration order) holds its final value for this step; leave it unchanged
  // until finish() (a device backend may still be copying it in). Starts its bucket's all-reduce
  // when that completes the bucket, and every earlier bucket is started (buckets start in the
  // same order on every rank). Throws ddprun::ConfigError for a bad index, ddprun::StateError when
  // the gradient was already marked in this step, the communicator's errors (copy or collective).
  void markReady(std::size_t index);
  // Ends the step. Synchronized: takes every gradient not yet marked as ready, waits for all
  // buckets and writes the averaged values back into the gradients; rethrows the first
  // collective or copy error, and then leaves the gradients unspecified (the step is lost; an
  // aborted communicator fails every later step too). Inside noSync(): leaves them untouched.
  void finish();

  // Skips communication until the returned guard is destroyed, as DDP's no_sync(): markReady()
  // and finish() only keep count, and leaving the outermost scope ends its step. Call between
  // steps: ddprun::StateError when a synchronized step has gradients marked already.
  class NoSyncGuard {
   public:
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    friend class GradientReducer;
    NoSyncGuard(GradientReducer& reducer, bool previous) : reducer_(reducer), previous_(previous) {}
    GradientReducer& reducer_;
    const bool previous_;
  };
  [[nodiscard]] NoSyncGuard noSync();
  // False inside a noSync() scope.
  bool syncEnabled() const;
  // The rank's own work per synchronized step (from the end of one finish() to the start of the
  // next: data, forward, backward, optimizer, not the wait for slower peers, which in a
  // data-parallel job is the same on every rank), the mean of the steps since the last call;
  // nothing when none was measured. For Heartbeat::beat(step, seconds), where stragglers are found.
  std::optional<double> takeStepSeconds();

  std::size_t gradientCount() const;
  std::size_t bucketCount() const;
  // The gradient indices in bucket `bucket`, in the order they are packed.
  std::vector<std::size_t> bucketGradients(std::size_t bucket) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp
