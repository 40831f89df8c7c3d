// The NCCL backend. The unique-id exchange through the store needs no GPU (ncclGetUniqueId works
// without one) and always runs where libddp was built with NCCL; whatever needs a device is
// skipped, with a warning, when cudaGetDeviceCount reports none.
#include <catch2/catch.hpp>

#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "worker_sdk/backends.h"
#include "worker_sdk/communicator.h"
#include "worker_sdk/in_memory_store.h"
#include "worker_sdk/unique_id_exchange.h"

using Catch::Matchers::Contains;
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

}  // namespace

TEST_CASE("unique-id exchange: rank 0 creates, every rank reads the same bytes", "[sdk]") {
  ddp::InMemoryStore store;
  int created = 0;
  const auto got = exchange(store, 4, [&] {
    ++created;  // rank 0 only: no race
    return std::string("id\0with-nul", 11);
  });
  CHECK(created == 1);
  for (const auto& id : got) CHECK(id == std::string("id\0with-nul", 11));

  ddp::InMemoryStore empty;
  CHECK_THROWS_WITH(ddp::detail::exchangeUniqueId(empty, 1, "unique_id", 50ms, [] { return std::string("x"); }),
                    Contains("unique_id"));
}

TEST_CASE("nccl: ncclUniqueId exchange through the store without a GPU", "[sdk][nccl]") {
  if (!ddp::isBackendAvailable(ddp::Backend::kNccl)) {
    // A build without CUDA/NCCL: the backend says so clearly instead.
    ddp::InMemoryStore store;
    CHECK_THROWS_WITH(ddp::makeCommunicator(ddp::Backend::kNccl, oneRankEnv(), store),
                      Contains("nccl") && Contains("without CUDA and NCCL"));
    return;
  }
  ddp::InMemoryStore store;
  const auto got = exchange(store, 4, ddp::detail::newNcclUniqueId);
  REQUIRE(got[0].size() == 128);  // NCCL_UNIQUE_ID_BYTES
  for (const auto& id : got) CHECK(id == got[0]);
  // A second round (a fresh store scope) gets a fresh id.
  ddp::InMemoryStore nextRound;
  CHECK(exchange(nextRound, 2, ddp::detail::newNcclUniqueId)[1] != got[0]);
}

TEST_CASE("nccl: a communicator on the device runs collectives and aborts cleanly", "[sdk][nccl]") {
  if (!ddp::isBackendAvailable(ddp::Backend::kNccl)) return;  // covered by the test above
  ddp::InMemoryStore store;
  if (ddp::detail::cudaDeviceCount() == 0) {
    CHECK_THROWS_WITH(ddp::makeCommunicator(ddp::Backend::kNccl, oneRankEnv(), store),
                      Contains("no CUDA device"));
    WARN("SKIPPED: the NCCL device test needs a GPU; cudaGetDeviceCount reports none");
    return;
  }
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
