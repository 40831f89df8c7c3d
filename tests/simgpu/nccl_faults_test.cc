// What libddp's NCCL communicator does when things go wrong, on simulated devices with faults
// injected (docs/simgpu.md): hung and failing collectives, slow peers, busy streams, failed
// CUDA calls, helper threads. Each case was seen failing on the code before its fix (the commit
// that fixed it names it). What must not happen lasts much longer than kSafetyBound.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <span>
#include <thread>

#include "common/error.h"
#include "safety_bound.h"
#include "tests/simgpu/simgpu_ranks.h"
#include "worker_sdk/gradient_reducer.h"

using Catch::Matchers::Contains;
using ddprun::test::kSafetyBound;
using simgpu::test::DeviceArray;
using simgpu::test::expect;
using simgpu::test::FaultEnv;
using simgpu::test::runRanks;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

// Polls until done() or kSafetyBound passed; returns whether done() became true.
template <typename Done>
bool within(Done done) {
  const auto deadline = Clock::now() + kSafetyBound;
  while (!done()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

std::string errorOf(const ddp::Work& work) {
  try {
    work.wait();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// Nobody calls wait(): only the communicator's own watchdog can notice, abort the communicator
// and fail the pending Work (which isCompleted() then reports).
TEST_CASE("simgpu nccl: a collective that hangs on one rank is aborted within the timeout without a wait(), naming "
          "the collective, the rank and the time",
          "[simgpu][nccl][fault]") {
  FaultEnv faults({{"DDPRUN_SIMGPU_HANG_COLLECTIVE", "1"}, {"DDPRUN_SIMGPU_FAULT_RANK", "1"}});
  std::vector<std::string> messages(2);
  std::vector<int> completed(2, 0);
  auto errors = runRanks(
      2,
      [&](ddp::Communicator& comm, int rank) {
        DeviceArray<float> buf(std::vector<float>(4, 1.0f));
        ddp::Work work = comm.allReduceAsync(buf.get(), buf.get(), 4, ddp::DataType::kFloat32, ddp::ReduceOp::kSum);
        completed[static_cast<std::size_t>(rank)] = within([&] { return work.isCompleted(); });
        messages[static_cast<std::size_t>(rank)] = errorOf(work);
      },
      simgpu::test::options(1s));
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << messages[static_cast<std::size_t>(r)]);
    CHECK(errors[static_cast<std::size_t>(r)] == "");
    CHECK(completed[static_cast<std::size_t>(r)] == 1);
    CHECK_THAT(messages[static_cast<std::size_t>(r)], Contains("allReduce"));
  }
  // The hung rank's own error: what, where, how long.
  CHECK_THAT(messages[1], Contains("rank 1") && Contains("timed out") && Contains("ms") && Contains("aborted"));
}

TEST_CASE("simgpu nccl: an asynchronous NCCL error aborts the communicator without a wait(), and the pending Work "
          "fails with NCCL's error",
          "[simgpu][nccl][fault]") {
  FaultEnv faults({{"DDPRUN_SIMGPU_ASYNC_ERROR", "2"}, {"DDPRUN_SIMGPU_FAULT_RANK", "0"}});
  std::string message;
  int completed = 0;
  auto errors = runRanks(
      2,
      [&](ddp::Communicator& comm, int rank) {
        comm.barrier();  // collective 1 succeeds
        DeviceArray<float> buf(std::vector<float>(4, 1.0f));
        // Held behind a "kernel" on the default stream until the enqueue returned, so that the
        // error comes after it (an error already there fails the enqueue itself).
        const unsigned long compute = simgpu_block_stream(nullptr);
        ddp::Work work = comm.allReduceAsync(buf.get(), buf.get(), 4, ddp::DataType::kFloat32, ddp::ReduceOp::kSum);
        simgpu_release_stream_block(compute);
        if (rank != 0) {
          errorOf(work);  // rank 1 waits for its own end (a remote error or its timeout)
          return;
        }
        completed = within([&] { return work.isCompleted(); });
        message = errorOf(work);
      },
      simgpu::test::options(10min));
  INFO(message);
  CHECK(completed == 1);
  CHECK_THAT(message, Contains("allReduce") && Contains("remote process exited or there was a network error"));
  CHECK(errors[0] == "");
}

// Rank on device 3: no call of the SDK, from whatever thread, may make a context on device 0
// (a stray context costs hundreds of MB on a real GPU that belongs to another rank).
TEST_CASE("simgpu nccl: helper threads that never called cudaSetDevice never touch device 0", "[simgpu][nccl]") {
  ddp::InProcessStore store(ddp::InProcessStoreOptions{60s});
  ddp::CommunicatorOptions o = simgpu::test::options();
  o.device = 3;
  std::string error;
  std::thread owner([&] {
    try {
      simgpu_reset_touches();
      auto comm = ddp::makeCommunicator(ddp::Backend::kNccl, simgpu::test::rankEnv(0, 1), store, o);
      auto buf = std::make_unique<DeviceArray<float>>(std::vector<float>(8, 2.0f));
      std::thread helper([&] {  // never calls cudaSetDevice
        try {
          ddp::Work work = comm->allReduceAsync(buf->get(), buf->get(), 8, ddp::DataType::kFloat32, ddp::ReduceOp::kSum);
          work.isCompleted();
          work.wait();
          std::vector<float> g1(5, 1.0f), g2(3, 2.0f);
          {
            ddp::GradientReducer reducer(*comm, {std::span<float>(g1), std::span<float>(g2)}, {});
            reducer.markReady(1);
            reducer.markReady(0);
            reducer.finish();
          }
          double loss[1] = {1.0};
          comm->allReduceHost(std::span<double>(loss), ddp::ReduceOp::kSum);
          comm.reset();  // destroyed on the helper thread
        } catch (const std::exception& e) {
          error = e.what();
        }
      });
      helper.join();
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  owner.join();
  REQUIRE(error == "");
  CHECK(simgpu_implicit_device0_calls() == 0);
  CHECK(simgpu_touched_devices() == (1u << 3));
}

// markReady() holds the reducer's lock: a copy in that waits for the stream (a pageable copy may
// synchronize with it) blocks backward behind an earlier bucket's all-reduce, i.e. behind the
// slowest peer, with no deadline.
TEST_CASE("simgpu nccl: markReady returns while an earlier bucket's all-reduce waits for a slow peer",
          "[simgpu][nccl][reducer]") {
  std::atomic<bool> secondMarked{false};
  int returnedInTime = -1;
  auto errors = runRanks(2, [&](ddp::Communicator& comm, int rank) {
    std::vector<float> g0(4, 1.0f + rank), g1(4, 3.0f + rank);
    // A 1-byte cap: one bucket per gradient, bucket 0 = g1 (reverse registration order).
    ddp::GradientReducer reducer(comm, {std::span<float>(g0), std::span<float>(g1)}, ddp::GradientReducerOptions{1});
    if (rank == 0) {
      reducer.markReady(1);  // starts bucket 0's all-reduce; rank 1 has not joined it
      reducer.markReady(0);
      secondMarked = true;
    } else {
      returnedInTime = within([&] { return secondMarked.load(); });
      reducer.markReady(1);
      reducer.markReady(0);
    }
    reducer.finish();
    expect(g0[0] == 1.5f && g1[0] == 3.5f, "averaged");
  });
  CHECK(errors[0] == "");
  CHECK(errors[1] == "");
  CHECK(returnedInTime == 1);
}

// The communicator's stream must not be a blocking stream: the legacy default stream (where a
// plain CUDA program computes) would then wait for every collective in flight.
TEST_CASE("simgpu nccl: work on the legacy default stream is not held behind a pending collective", "[simgpu][nccl]") {
  std::atomic<bool> defaultStreamRan{false};
  int ranInTime = -1;
  auto errors = runRanks(2, [&](ddp::Communicator& comm, int rank) {
    cudaSetDevice(rank);
    DeviceArray<float> buf(std::vector<float>(4, 1.0f));
    if (rank == 0) {
      ddp::Work work = comm.allReduceAsync(buf.get(), buf.get(), 4, ddp::DataType::kFloat32, ddp::ReduceOp::kSum);
      cudaEvent_t event = nullptr;
      expect(cudaEventCreateWithFlags(&event, cudaEventDisableTiming) == cudaSuccess, "event");
      expect(cudaEventRecord(event, nullptr) == cudaSuccess, "record on the legacy default stream");
      within([&] { return cudaEventQuery(event) == cudaSuccess; });
      defaultStreamRan = cudaEventQuery(event) == cudaSuccess;
      cudaEventDestroy(event);
      work.wait();
    } else {
      ranInTime = within([&] { return defaultStreamRan.load(); });
      comm.allReduce(buf.get(), buf.get(), 4, ddp::DataType::kFloat32, ddp::ReduceOp::kSum);
    }
  });
  CHECK(errors[0] == "");
  CHECK(errors[1] == "");
  CHECK(ranInTime == 1);
}

// A start that fails must leave nothing in flight: GradientReducer retries a failed start, and a
// leaked collective would pair the retry with the peers' next collective.
TEST_CASE("simgpu nccl: a failed event creation leaves no collective in flight, so the retry pairs with the peer's",
          "[simgpu][nccl][fault]") {
  std::atomic<bool> failedOnce{false};
  std::string firstError;
  auto errors = runRanks(2, [&](ddp::Communicator& comm, int rank) {
    comm.barrier();
    DeviceArray<float> buf(std::vector<float>(4, 1.0f + rank));
    if (rank == 0) {
      {
        FaultEnv faults({{"DDPRUN_SIMGPU_FAIL_EVENT_CREATE", "1"}});
        try {
          comm.allReduceAsync(buf.get(), buf.get(), 4, ddp::DataType::kFloat32, ddp::ReduceOp::kSum);
        } catch (const std::exception& e) {
          firstError = e.what();
        }
      }
      failedOnce = true;
    } else {
      expect(within([&] { return failedOnce.load(); }), "rank 0 never tried");
    }
    comm.allReduce(buf.get(), buf.get(), 4, ddp::DataType::kFloat32, ddp::ReduceOp::kSum);
    expect(buf.read()[0] == 3.0f, "the retried all-reduce summed the ranks' values");
    comm.barrier();
  });
  CHECK_THAT(firstError, Contains("cudaErrorMemoryAllocation"));
  CHECK(errors[0] == "");
  CHECK(errors[1] == "");
}

TEST_CASE("simgpu nccl: allReduceHost reuses pinned staging memory: no cudaMalloc or cudaFree per call",
          "[simgpu][nccl]") {
  long mallocs = -1, frees = -1;
  auto errors = runRanks(2, [&](ddp::Communicator& comm, int rank) {
    double totals[2] = {1.0, 2.0};
    comm.allReduceHost(std::span<double>(totals), ddp::ReduceOp::kSum);  // the first may allocate
    comm.barrier();
    const long m0 = simgpu_device_malloc_calls(), f0 = simgpu_device_free_calls();
    for (int i = 0; i < 10; ++i) comm.allReduceHost(std::span<double>(totals), ddp::ReduceOp::kSum);
    comm.barrier();
    if (rank == 0) {
      mallocs = simgpu_device_malloc_calls() - m0;
      frees = simgpu_device_free_calls() - f0;
    }
    comm.barrier();
  });
  CHECK(errors[0] == "");
  CHECK(mallocs == 0);
  CHECK(frees == 0);
}

// The destructor finishes what was issued, but a peer that never comes must not hold it for the
// communicator's timeout (30 minutes by default; 10 here).
TEST_CASE("simgpu nccl: destroying a communicator whose peer never joins its last collective does not wait out "
          "the timeout",
          "[simgpu][nccl][fault]") {
  ddp::InProcessStore store(ddp::InProcessStoreOptions{60s});
  std::atomic<bool> destroyed{false};
  int destroyedInTime = -1;
  std::string error;
  std::thread rank0([&] {
    try {
      auto comm = ddp::makeCommunicator(ddp::Backend::kNccl, simgpu::test::rankEnv(0, 2), store,
                                        simgpu::test::options(10min));
      DeviceArray<float> buf(std::vector<float>(4, 1.0f));
      ddp::Work work = comm->allReduceAsync(buf.get(), buf.get(), 4, ddp::DataType::kFloat32, ddp::ReduceOp::kSum);
      comm.reset();
      destroyed = true;
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  std::thread rank1([&] {
    try {
      auto comm = ddp::makeCommunicator(ddp::Backend::kNccl, simgpu::test::rankEnv(1, 2), store,
                                        simgpu::test::options(10min));
      destroyedInTime = within([&] { return destroyed.load(); });
      // Joins late (the old code's destructor waits for this); after an abort it fails fast.
      DeviceArray<float> buf(std::vector<float>(4, 1.0f));
      try {
        comm->allReduce(buf.get(), buf.get(), 4, ddp::DataType::kFloat32, ddp::ReduceOp::kSum);
      } catch (const std::exception&) {
      }
      comm->abort();
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  rank0.join();
  rank1.join();
  CHECK(error == "");
  CHECK(destroyedInTime == 1);
}

TEST_CASE("simgpu nccl: a failed cudaMalloc while making the communicator is a clear error", "[simgpu][nccl][fault]") {
  FaultEnv faults({{"DDPRUN_SIMGPU_FAIL_MALLOC", "1"}});
  auto errors = runRanks(1, [&](ddp::Communicator&, int) {});
  CHECK_THAT(errors[0], Contains("cudaMalloc") && Contains("out of memory"));
}

TEST_CASE("simgpu nccl: an NCCL library older than 2.14 is refused with both versions before any NCCL call",
          "[simgpu][nccl]") {
  FaultEnv faults({{"DDPRUN_SIMGPU_NCCL_VERSION", "21304"}});
  auto errors = runRanks(1, [&](ddp::Communicator&, int) {});
  CHECK_THAT(errors[0], Contains("NCCL library loaded is 2.13.4") && Contains("needs 2.14 or newer"));
}

TEST_CASE("simgpu nccl: a slow rank delays collectives but fails none within the timeout", "[simgpu][nccl][fault]") {
  FaultEnv faults({{"DDPRUN_SIMGPU_SLOW_MS", "200"}, {"DDPRUN_SIMGPU_FAULT_RANK", "1"}});
  auto errors = runRanks(3, [&](ddp::Communicator& comm, int rank) {
    DeviceArray<float> buf(std::vector<float>(4, 1.0f + rank));
    for (int i = 0; i < 3; ++i) {
      ddp::Work work = comm.allReduceAsync(buf.get(), buf.get(), 4, ddp::DataType::kFloat32, ddp::ReduceOp::kMax);
      work.wait();
    }
    expect(buf.read()[0] == 3.0f, "max over the ranks");
    comm.barrier();
  });
  for (int r = 0; r < 3; ++r) CHECK(errors[static_cast<std::size_t>(r)] == "");
}
