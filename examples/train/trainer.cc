#include "examples/train/trainer.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iomanip>
#include <stdexcept>
#include <string>
#include <thread>

#include "examples/train/checkpoint.h"
#include "examples/train/dataset.h"
#include "examples/train/model.h"
#include "worker_sdk/gradient_reducer.h"
#include "worker_sdk/heartbeat.h"

namespace train {

namespace {

// One bucket (the model is 2.3 KB): one all-reduce per step keeps a step cheap when 4 ranks share
// 2 cores; larger models get several buckets that overlap the backward pass.
constexpr std::size_t kBucketCapBytes = 64 * 1024;

class Trainer {
 public:
  Trainer(const Options& options, const ddp::Env& env, ddp::Communicator& comm, std::ostream& out)
      : options_(options),
        env_(env),
        comm_(comm),
        out_(out),
        data_(static_cast<std::size_t>(options.samples), options.seed),
        model_(options.seed),
        reducer_(comm, model_.gradients(), ddp::GradientReducerOptions{kBucketCapBytes, true}),
        heartbeat_(env),
        localBatch_(options.batch / comm.size()) {}

  int run() {
    const bool leader = comm_.rank() == 0;
    int firstEpoch = 1;
    if (!options_.checkpoint.empty()) {
      if (auto c = loadCheckpoint(options_.checkpoint, model_.parameterCount())) {
        if (c->seed != options_.seed) {
          throw std::runtime_error("checkpoint " + options_.checkpoint + " was written by a run with --seed " +
                                   std::to_string(c->seed) + ", not " + std::to_string(options_.seed));
        }
        model_.setFlatParameters(c->params);
        firstEpoch = c->epochsDone + 1;
        if (leader) {
          out_ << "resumed from epoch " << firstEpoch << " (checkpoint " << options_.checkpoint << ")" << std::endl;
        }
      }
    }
    if (leader) {
      const auto init = model_.flatParameters();
      out_ << "train: world_size " << comm_.size() << " backend " << ddp::toString(comm_.backend()) << " samples "
           << data_.size() << " batch " << options_.batch << " (" << localBatch_ << " per rank) params "
           << model_.parameterCount() << std::endl;
      out_ << "start_digest " << digest(init) << " params_l2 " << std::setprecision(6) << std::fixed << l2(init)
           << std::endl;
    }
    for (int epoch = firstEpoch; epoch <= options_.epochs; ++epoch) {
      if (epoch == options_.crashAtEpoch && comm_.rank() == 1 && env_.restartCount == 0) {
        std::fprintf(stderr, "rank 1: --crash_at_epoch %d: exiting with code 3\n", epoch);
        std::fflush(nullptr);
        std::_Exit(3);
      }
      const double loss = trainEpoch(epoch);
      if (leader) out_ << "epoch " << epoch << " loss " << std::setprecision(6) << std::fixed << loss << std::endl;
      if (!options_.checkpoint.empty()) {
        if (leader) saveCheckpoint(options_.checkpoint, Checkpoint{epoch, options_.seed, model_.flatParameters()});
        comm_.barrier();  // nobody runs ahead of a checkpoint that is not on disk yet
      }
    }
    if (leader) {
      const auto params = model_.flatParameters();
      out_ << "digest " << digest(params) << " params_l2 " << std::setprecision(6) << std::fixed << l2(params)
           << std::endl;
    }
    return 0;
  }

 private:
  // One pass over the data; returns the global mean loss of its samples.
  double trainEpoch(int epoch) {
    const auto order = epochOrder(data_.size(), options_.seed, epoch);
    const std::size_t steps = data_.size() / static_cast<std::size_t>(options_.batch);  // drop_last
    const std::size_t world = static_cast<std::size_t>(comm_.size());
    const std::size_t rank = static_cast<std::size_t>(comm_.rank());
    // The reducer averages over ranks; each rank contributes (world / batch) * its gradient sum.
    const double scale = double(comm_.size()) / double(options_.batch);
    double lossSum = 0;
    for (std::size_t s = 0; s < steps; ++s) {
      model_.zeroGrad();
      // DistributedSampler's split of the global batch: rank r takes every world-th sample.
      for (std::size_t j = 0; j < static_cast<std::size_t>(localBatch_); ++j) {
        const std::size_t i = order[s * static_cast<std::size_t>(options_.batch) + rank + world * j];
        lossSum += model_.accumulate(data_.features(i), data_.target(i));
      }
      testHooks(globalStep_ + 1);
      // Backward finishes the last layer first: hand the reducer b2, w2, b1, w1 in that order.
      for (int t = Mlp::kTensors - 1; t >= 0; --t) {
        model_.writeGradient(t, scale);
        reducer_.markReady(static_cast<std::size_t>(t));
      }
      reducer_.finish();
      model_.step(static_cast<float>(options_.lr));
      heartbeat_.beat(++globalStep_, reducer_.takeStepSeconds());
    }
    double totals[2] = {lossSum, double(steps * static_cast<std::size_t>(localBatch_))};
    comm_.allReduceHost(std::span<double>(totals), ddp::ReduceOp::kSum);  // staged through the device on nccl
    return totals[0] / totals[1];
  }

  void testHooks(int64_t step) {
    if (comm_.rank() == options_.slowRank && options_.slowMs > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(options_.slowMs));
    }
    if (comm_.rank() != 1 || env_.restartCount != 0) return;
    if (step == options_.stallAtStep) {
      std::fprintf(stderr, "rank 1: --stall_at_step %lld: stuck before its all-reduce\n", static_cast<long long>(step));
      std::fflush(nullptr);
      std::this_thread::sleep_for(std::chrono::seconds(600));
    }
    if (step == options_.leaveAtStep) {
      std::fprintf(stderr, "rank 1: --leave_at_step %lld: exiting with 0\n", static_cast<long long>(step));
      std::fflush(nullptr);
      std::_Exit(0);
    }
  }

  const Options& options_;
  const ddp::Env& env_;
  ddp::Communicator& comm_;
  std::ostream& out_;
  Dataset data_;
  Mlp model_;
  ddp::GradientReducer reducer_;
  ddp::Heartbeat heartbeat_;
  const int localBatch_;
  int64_t globalStep_ = 0;
};

}  // namespace

int runTraining(const Options& options, const ddp::Env& env, ddp::Communicator& comm, std::ostream& out) {
  return Trainer(options, env, comm, out).run();
}

}  // namespace train
