// The NCCL backend. The unique-id exchange through the store needs no GPU (ncclGetUniqueId works
// without one) and runs wherever libddp was built with NCCL; whatever needs a device (or two) is
// reported skipped, with the reason, when cudaGetDeviceCount reports fewer (test_skip.h), and
// the refusals are checked where they happen (a build without NCCL, a machine without a GPU).
// The same NCCL path runs with up to 4 ranks on simulated devices everywhere: tests/simgpu.
#include <catch2/catch.hpp>

#include <algorithm>
#include <exception>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "test_skip.h"
#include "worker_sdk/backends.h"
#include "worker_sdk/communicator.h"
#include "worker_sdk/gradient_reducer.h"
#include "worker_sdk/in_process_store.h"
#include "worker_sdk/unique_id_exchange.h"

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using namespace std::chrono_literals;

namespace {

// Runs the exchange on `size` threads; returns what every rank got.
std::vector<std::string> exchange(ddp::Store& store, int size, const std::function<std::string()>& create) {
  std::vector<std::string> got(static_cast<std::size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        got[static_cast<std::size_t>(r)] = ddp::detail::exchangeUniqueId(store, r, "unique_id", 10s, create);
      } catch (const std::exception& e) {
        got[static_cast<std::size_t>(r)] = std::string("error: ") + e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return got;
}

ddp::Env oneRankEnv() {
  ddp::Env env;
  env.masterAddr = "127.0.0.1";
  env.masterPort = 29500;
  return env;
}

ddp::Env rankEnv(int rank, int size) {
  ddp::Env env = oneRankEnv();
  env.rank = rank;
  env.worldSize = size;
  env.localRank = rank;
  env.localWorldSize = size;
  return env;
}

// Gradient g of rank r at element i, in step `step`.
float gradValue(int r, std::size_t g, std::size_t i, int step) {
  return static_cast<float>(r * 10 + g) + 0.25f * static_cast<float>(i) + static_cast<float>(step);
}

// One rank of the staging tests on its own device (device = rank): a staging round trip,
// allReduceHost, and two reducer steps with small buckets. Returns the gradients; throws on a wrong intermediate value
// (Catch2's assertions are not thread-safe).
std::vector<std::vector<float>> stagedRank(ddp::Store& store, int rank, int size) {
  ddp::CommunicatorOptions options;
  options.timeout = 60s;
  options.device = rank;
  auto comm = ddp::makeCommunicator(ddp::Backend::kNccl, rankEnv(rank, size), store, options);
  if (comm->memoryKind() != ddp::MemoryKind::kDevice) throw std::runtime_error("nccl reports host memory");

  auto buffer = comm->makeStagingBuffer(16 * sizeof(float));
  std::vector<float> in(16), out(16, -1.0f);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i) + 0.5f;
  buffer->copyFromHost(in.data(), 16 * sizeof(float), 0);
  buffer->copyToHost(out.data(), 8 * sizeof(float), 8 * sizeof(float));  // the second half, to the front
  if (!std::equal(in.begin() + 8, in.end(), out.begin())) throw std::runtime_error("staging round trip differs");

  double totals[2] = {1.5 * (rank + 1), 1.0};
  comm->allReduceHost(std::span<double>(totals), ddp::ReduceOp::kSum);
  if (totals[1] != size) throw std::runtime_error("allReduceHost: wrong sum");

  const std::vector<std::size_t> sizes{7, 1, 300, 12, 5};
  std::vector<std::vector<float>> grads;
  std::vector<std::span<float>> spans;
  for (std::size_t n : sizes) grads.emplace_back(n);
  for (auto& g : grads) spans.emplace_back(g);
  ddp::GradientReducer reducer(*comm, spans, ddp::GradientReducerOptions{64});
  for (int step = 0; step < 2; ++step) {
    for (std::size_t g = 0; g < grads.size(); ++g) {
      for (std::size_t i = 0; i < grads[g].size(); ++i) grads[g][i] = gradValue(rank, g, i, step);
    }
    for (std::size_t g = grads.size(); g-- > 0;) reducer.markReady(g);
    reducer.finish();
  }
  return grads;
}

// Runs stagedRank on `size` threads, rank r on device r, and checks that every rank ends with
// the mean over the ranks of the last step's gradients.
void checkStagedRanks(int size) {
  ddp::InProcessStore store(ddp::InProcessStoreOptions{60s});
  std::vector<std::vector<std::vector<float>>> results(static_cast<std::size_t>(size));
  std::vector<std::string> errors(static_cast<std::size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        results[static_cast<std::size_t>(r)] = stagedRank(store, r, size);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < size; ++r) {
    INFO("rank " << r << " of " << size);
    REQUIRE(errors[static_cast<std::size_t>(r)] == "");
    const auto& grads = results[static_cast<std::size_t>(r)];
    for (std::size_t g = 0; g < grads.size(); ++g) {
      for (std::size_t i = 0; i < grads[g].size(); ++i) {
        float mean = 0;
        for (int q = 0; q < size; ++q) mean += gradValue(q, g, i, 1);
        mean /= static_cast<float>(size);
        CHECK(grads[g][i] == Approx(mean).epsilon(1e-6));
      }
    }
  }
}

const char* const kNoNcclBuild = "this libddp was built without CUDA and NCCL";

std::string devicesVisible(int devices) {
  return std::to_string(devices) + " CUDA device(s) visible (cudaGetDeviceCount)";
}

}  // namespace

TEST_CASE("unique-id exchange: rank 0 creates, every rank reads the same bytes", "[sdk]") {
  ddp::InProcessStore store;
  int created = 0;
  const auto got = exchange(store, 4, [&] {
    ++created;  // rank 0 only: no race
    return std::string("id\0with-nul", 11);
  });
  CHECK(created == 1);
  for (const auto& id : got) CHECK(id == std::string("id\0with-nul", 11));

  ddp::InProcessStore empty;
  CHECK_THROWS_WITH(ddp::detail::exchangeUniqueId(empty, 1, "unique_id", 50ms, [] { return std::string("x"); }),
                    Contains("unique_id"));
}

TEST_CASE("nccl: a real ncclUniqueId from rank 0 reaches every rank through the store, no GPU needed", "[sdk][nccl]") {
  if (!ddp::isBackendAvailable(ddp::Backend::kNccl)) DDPRUN_SKIP(kNoNcclBuild);
  ddp::InProcessStore store;
  const auto got = exchange(store, 4, ddp::detail::newNcclUniqueId);
  REQUIRE(got[0].size() == 128);  // NCCL_UNIQUE_ID_BYTES
  for (const auto& id : got) CHECK(id == got[0]);
  // A second round (a fresh store scope) gets a fresh id.
  ddp::InProcessStore nextRound;
  CHECK(exchange(nextRound, 2, ddp::detail::newNcclUniqueId)[1] != got[0]);
}

TEST_CASE("nccl: a build without CUDA and NCCL refuses the backend, saying so", "[sdk][nccl]") {
  if (ddp::isBackendAvailable(ddp::Backend::kNccl)) {
    DDPRUN_SKIP("this libddp has the NCCL backend; the refusal of a build without it happens only there");
  }
  ddp::InProcessStore store;
  CHECK_THROWS_WITH(ddp::makeCommunicator(ddp::Backend::kNccl, oneRankEnv(), store),
                    Contains("nccl") && Contains("without CUDA and NCCL"));
}

TEST_CASE("nccl: without a CUDA device makeCommunicator refuses, naming the missing device", "[sdk][nccl]") {
  if (!ddp::isBackendAvailable(ddp::Backend::kNccl)) DDPRUN_SKIP(kNoNcclBuild);
  const int devices = ddp::detail::cudaDeviceCount();
  if (devices > 0) DDPRUN_SKIP("needs a machine without a GPU; " + devicesVisible(devices));
  ddp::InProcessStore store;
  CHECK_THROWS_AS(ddp::makeCommunicator(ddp::Backend::kNccl, oneRankEnv(), store), ddprun::ConfigError);
  CHECK_THROWS_WITH(ddp::makeCommunicator(ddp::Backend::kNccl, oneRankEnv(), store), Contains("no CUDA device"));
}

TEST_CASE("nccl: a communicator on the device runs collectives and aborts cleanly", "[sdk][nccl]") {
  if (!ddp::isBackendAvailable(ddp::Backend::kNccl)) DDPRUN_SKIP(kNoNcclBuild);
  const int devices = ddp::detail::cudaDeviceCount();
  if (devices == 0) DDPRUN_SKIP("needs a CUDA device; " + devicesVisible(devices));
  ddp::InProcessStore store;
  ddp::CommunicatorOptions options;
  options.timeout = 60s;
  auto comm = ddp::makeCommunicator(ddp::Backend::kNccl, oneRankEnv(), store, options);
  CHECK(comm->backend() == ddp::Backend::kNccl);
  CHECK(comm->size() == 1);
  comm->barrier();  // an all-reduce on the device, waited for through its CUDA event
  ddp::Work w = comm->barrierAsync();
  w.wait();
  CHECK(w.isCompleted());
  comm->abort();
  CHECK_THROWS_AS(comm->barrier(), ddprun::StateError);
}

TEST_CASE("nccl: whyBackendUnusable names the missing build or device", "[sdk][nccl]") {
  // Checks whichever of the three cases this machine is: each has its own answer.
  CHECK(ddp::whyBackendUnusable(ddp::Backend::kGloo).empty());
  const std::string why = ddp::whyBackendUnusable(ddp::Backend::kNccl);
  if (!ddp::isBackendAvailable(ddp::Backend::kNccl)) {
    CHECK_THAT(why, StartsWith("is not available: ") && Contains("without CUDA and NCCL"));
  } else if (ddp::detail::cudaDeviceCount() == 0) {
    CHECK_THAT(why, StartsWith("needs a CUDA device: "));  // then CUDA's own message
  } else {
    CHECK(why.empty());
  }
}

// One rank: what the staging path does to values on a device (copies in and out, the bucket
// layout, the average over one rank); it cannot show that ranks' gradients are combined.
TEST_CASE("nccl: one rank on one device: staging copies, allReduceHost and GradientReducer keep the values",
          "[sdk][nccl][reducer]") {
  if (!ddp::isBackendAvailable(ddp::Backend::kNccl)) DDPRUN_SKIP(kNoNcclBuild);
  const int devices = ddp::detail::cudaDeviceCount();
  if (devices == 0) DDPRUN_SKIP("needs a CUDA device; " + devicesVisible(devices));
  checkStagedRanks(1);
}

// Two ranks on two distinct devices (NCCL puts one rank on one device): the reducer must average
// different gradients, so a reduction that does nothing fails here.
TEST_CASE("nccl: two ranks on two devices: GradientReducer averages the ranks' gradients through device memory",
          "[sdk][nccl][reducer]") {
  if (!ddp::isBackendAvailable(ddp::Backend::kNccl)) DDPRUN_SKIP(kNoNcclBuild);
  const int devices = ddp::detail::cudaDeviceCount();
  if (devices < 2) DDPRUN_SKIP("needs two CUDA devices, one per rank; " + devicesVisible(devices));
  checkStagedRanks(2);
}
