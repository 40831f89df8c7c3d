// GradientReducer: DDP's bucketing (reverse registration order, cap), buckets started as soon as
// they are ready and always in order, averaging over real gloo ranks (threads), and noSync()
// accumulation. A fake one-rank communicator records what the reducer asks for.
#include <catch2/catch.hpp>

#include <exception>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "worker_sdk/communicator.h"
#include "worker_sdk/gradient_reducer.h"
#include "worker_sdk/in_process_store.h"
#include "tests/support/sdk_ranks.h"

using namespace std::chrono_literals;

namespace {

// One rank; every all-reduce completes at once (a world of one), recorded with its size.
class RecordingCommunicator final : public ddp::Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  ddp::Backend backend() const override { return ddp::Backend::kGloo; }
  void abort() override {}

  std::vector<std::size_t> allReduces;  // element counts, in issue order
  std::vector<ddp::ReduceOp> ops;

 protected:
  ddp::Work startAllReduce(const void*, void*, std::size_t count, ddp::DataType, ddp::ReduceOp op) override {
    allReduces.push_back(count);
    ops.push_back(op);
    return {};
  }
  ddp::Work startBroadcast(const void*, void*, std::size_t, ddp::DataType, int) override { return {}; }
  ddp::Work startAllGather(const void*, void*, std::size_t, ddp::DataType) override { return {}; }
  ddp::Work startReduceScatter(const void*, void*, std::size_t, ddp::DataType, ddp::ReduceOp) override { return {}; }
  ddp::Work startBarrier() override { return {}; }
};

std::vector<std::span<float>> spans(std::vector<std::vector<float>>& grads) {
  std::vector<std::span<float>> out;
  for (auto& g : grads) out.emplace_back(g);
  return out;
}

// Gradient g of rank r at element i.
float gradValue(int r, std::size_t g, std::size_t i) { return static_cast<float>(r * 10 + g) + 0.25f * i; }

}  // namespace

TEST_CASE("GradientReducer: buckets in reverse registration order, closed at the cap", "[sdk][reducer]") {
  RecordingCommunicator comm;
  std::vector<std::vector<float>> grads{std::vector<float>(3), std::vector<float>(5), std::vector<float>(2),
                                        std::vector<float>(4)};
  // 6 floats per bucket: gradients 3 (16 B) + 2 (8 B) reach 24 B; then 1 + 0.
  ddp::GradientReducer reducer(comm, spans(grads), ddp::GradientReducerOptions{6 * sizeof(float)});
  REQUIRE(reducer.gradientCount() == 4);
  REQUIRE(reducer.bucketCount() == 2);
  CHECK(reducer.bucketGradients(0) == std::vector<std::size_t>{3, 2});
  CHECK(reducer.bucketGradients(1) == std::vector<std::size_t>{1, 0});
  CHECK_THROWS_AS(reducer.bucketGradients(2), ddprun::ConfigError);

  ddp::GradientReducer oneBucket(comm, spans(grads));  // 25 MB holds them all
  CHECK(oneBucket.bucketCount() == 1);
  CHECK(oneBucket.bucketGradients(0) == std::vector<std::size_t>{3, 2, 1, 0});
}

TEST_CASE("GradientReducer: a bucket starts when its last gradient is ready, buckets in order", "[sdk][reducer]") {
  RecordingCommunicator comm;
  std::vector<std::vector<float>> grads{std::vector<float>(3), std::vector<float>(5), std::vector<float>(2),
                                        std::vector<float>(4)};
  ddp::GradientReducer reducer(comm, spans(grads), ddp::GradientReducerOptions{6 * sizeof(float)});
  reducer.markReady(3);
  CHECK(comm.allReduces.empty());
  reducer.markReady(2);  // bucket 0 complete: starts now, before the backward pass ends
  CHECK(comm.allReduces == std::vector<std::size_t>{6});
  CHECK(comm.ops == std::vector<ddp::ReduceOp>{ddp::ReduceOp::kAvg});
  reducer.markReady(0);
  reducer.markReady(1);
  CHECK(comm.allReduces == std::vector<std::size_t>{6, 8});
  reducer.finish();

  // Bucket 1 ready first waits for bucket 0: every rank issues the same order.
  reducer.markReady(1);
  reducer.markReady(0);
  CHECK(comm.allReduces.size() == 2);
  reducer.markReady(2);
  reducer.markReady(3);
  CHECK(comm.allReduces == std::vector<std::size_t>{6, 8, 6, 8});
  CHECK_THROWS_AS(reducer.markReady(3), ddprun::StateError);  // twice in one step
  CHECK_THROWS_AS(reducer.markReady(4), ddprun::ConfigError);
  reducer.finish();

  // finish() takes unmarked gradients as ready.
  reducer.markReady(3);
  reducer.finish();
  CHECK(comm.allReduces.size() == 6);
}

TEST_CASE("GradientReducer: finish() leaves every gradient at the mean over ranks", "[sdk][reducer]") {
  const int size = GENERATE(2, 3);
  const std::vector<std::size_t> sizes{7, 1, 300, 12, 5};
  std::vector<std::vector<std::vector<float>>> results(static_cast<std::size_t>(size));
  ddp::test::runGlooRanks(size, [&](ddp::Communicator& comm) {
    const int r = comm.rank();
    std::vector<std::vector<float>> grads;
    for (std::size_t g = 0; g < sizes.size(); ++g) {
      grads.emplace_back(sizes[g]);
    }
    // Small buckets: several of them, with boundaries inside the list.
    ddp::GradientReducer reducer(comm, spans(grads), ddp::GradientReducerOptions{64});
    for (int step = 0; step < 2; ++step) {
      for (std::size_t g = 0; g < grads.size(); ++g) {
        for (std::size_t i = 0; i < grads[g].size(); ++i) grads[g][i] = gradValue(r, g, i) + step;
      }
      for (std::size_t g = grads.size(); g-- > 0;) reducer.markReady(g);  // backward: last first
      reducer.finish();
    }
    results[static_cast<std::size_t>(r)] = grads;
  });
  for (int r = 0; r < size; ++r) {
    for (std::size_t g = 0; g < sizes.size(); ++g) {
      for (std::size_t i = 0; i < sizes[g]; ++i) {
        float mean = 0;
        for (int q = 0; q < size; ++q) mean += gradValue(q, g, i) + 1;
        mean /= static_cast<float>(size);
        INFO("rank " << r << " gradient " << g << " element " << i);
        CHECK(results[static_cast<std::size_t>(r)][g][i] == Approx(mean).epsilon(1e-6));
      }
    }
  }
}

TEST_CASE("GradientReducer: noSync accumulates locally, the next synced step reduces the sum", "[sdk][reducer]") {
  constexpr int kSize = 2;
  struct Out {
    std::vector<float> afterNoSync, afterSync;
  };
  std::vector<Out> outs(kSize);
  ddp::test::runGlooRanks(kSize, [&](ddp::Communicator& comm) {
    const int r = comm.rank();
    std::vector<std::vector<float>> grads{std::vector<float>(4, 0.0f)};
    ddp::GradientReducer reducer(comm, spans(grads));
    Out& o = outs[static_cast<std::size_t>(r)];
    {
      auto guard = reducer.noSync();
      if (reducer.syncEnabled()) throw std::runtime_error("noSync did not disable sync");
      for (float& v : grads[0]) v += static_cast<float>(r + 1);  // micro-batch 1, accumulated
      reducer.markReady(0);
      reducer.finish();
      o.afterNoSync = grads[0];
    }
    if (!reducer.syncEnabled()) throw std::runtime_error("sync not restored");
    for (float& v : grads[0]) v += static_cast<float>(10 * (r + 1));  // micro-batch 2
    reducer.markReady(0);
    reducer.finish();
    o.afterSync = grads[0];
  });
  CHECK(outs[0].afterNoSync == std::vector<float>(4, 1.0f));  // untouched: no communication
  CHECK(outs[1].afterNoSync == std::vector<float>(4, 2.0f));
  // Mean over ranks of the accumulated sums: (11 + 22) / 2.
  CHECK(outs[0].afterSync == std::vector<float>(4, 16.5f));
  CHECK(outs[1].afterSync == std::vector<float>(4, 16.5f));
}

TEST_CASE("GradientReducer: noSync communicates nothing and is refused inside a synced step", "[sdk][reducer]") {
  RecordingCommunicator comm;
  std::vector<std::vector<float>> grads{std::vector<float>(2, 1.0f), std::vector<float>(2, 2.0f)};
  ddp::GradientReducer reducer(comm, spans(grads));
  {
    auto outer = reducer.noSync();
    {
      auto inner = reducer.noSync();
    }
    CHECK_FALSE(reducer.syncEnabled());  // the inner scope restores the outer one
    reducer.markReady(0);
    reducer.markReady(1);
  }  // leaving without finish() ends the unsynchronized step
  CHECK(comm.allReduces.empty());
  CHECK(reducer.syncEnabled());
  reducer.markReady(1);
  CHECK_THROWS_AS(reducer.noSync(), ddprun::StateError);
  reducer.finish();
  CHECK(comm.allReduces == std::vector<std::size_t>{4});
  CHECK(grads[1] == std::vector<float>(2, 2.0f));  // a world of one: the mean is the value
}

TEST_CASE("GradientReducer: sums instead of averages when asked", "[sdk][reducer]") {
  RecordingCommunicator comm;
  std::vector<std::vector<float>> grads{std::vector<float>(2, 1.0f)};
  ddp::GradientReducerOptions options;
  options.average = false;
  ddp::GradientReducer reducer(comm, spans(grads), options);
  reducer.finish();
  CHECK(comm.ops == std::vector<ddp::ReduceOp>{ddp::ReduceOp::kSum});
}
