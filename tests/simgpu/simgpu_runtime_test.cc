// The simulator itself: that it is as strict as the docs say (docs/simgpu.md), so the SDK tests
// built on it mean something.
#include <catch2/catch.hpp>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "tests/simgpu/simgpu.h"

TEST_CASE("simgpu: device memory pointers are checked: host, freed, out of range", "[simgpu]") {
  REQUIRE(cudaSetDevice(1) == cudaSuccess);
  void* dev = nullptr;
  REQUIRE(cudaMalloc(&dev, 64) == cudaSuccess);
  std::vector<char> host(64, 'x');
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  CHECK(cudaMemcpyAsync(dev, host.data(), 64, cudaMemcpyHostToDevice, stream) == cudaSuccess);
  CHECK(cudaMemcpyAsync(dev, host.data(), 65, cudaMemcpyHostToDevice, stream) == cudaErrorInvalidValue);
  CHECK(cudaMemcpyAsync(host.data(), host.data(), 8, cudaMemcpyDeviceToHost, stream) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaSuccess);  // taken
  REQUIRE(cudaFree(dev) == cudaSuccess);
  CHECK(cudaFree(dev) == cudaErrorInvalidValue);
  CHECK(cudaMemcpyAsync(dev, host.data(), 8, cudaMemcpyHostToDevice, stream) == cudaErrorInvalidValue);
  CHECK(cudaStreamDestroy(stream) == cudaSuccess);
  CHECK(cudaStreamDestroy(stream) == cudaErrorInvalidResourceHandle);
}

TEST_CASE("simgpu: a thread that never called cudaSetDevice lands on device 0 and is counted", "[simgpu]") {
  simgpu_reset_touches();
  std::thread([] {
    REQUIRE(cudaSetDevice(2) == cudaSuccess);
    cudaEvent_t e = nullptr;
    REQUIRE(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess);
    cudaEventDestroy(e);
  }).join();
  CHECK(simgpu_touched_devices() == (1u << 2));
  CHECK(simgpu_implicit_device0_calls() == 0);
  std::thread([] {
    cudaEvent_t e = nullptr;
    REQUIRE(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess);
    cudaEventDestroy(e);
  }).join();
  CHECK(simgpu_touched_devices() == ((1u << 2) | 1u));
  CHECK(simgpu_implicit_device0_calls() > 0);
}

TEST_CASE("simgpu: streams run after the call returns, and events report cudaErrorNotReady until then", "[simgpu]") {
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  void* dev = nullptr;
  REQUIRE(cudaMalloc(&dev, 4) == cudaSuccess);
  void* pinned = nullptr;
  REQUIRE(cudaHostAlloc(&pinned, 4, cudaHostAllocDefault) == cudaSuccess);
  std::memcpy(pinned, "abc", 4);
  const unsigned long block = simgpu_block_stream(stream);
  REQUIRE(block != 0);
  // Pinned: asynchronous, returns while the stream is held.
  CHECK(cudaMemcpyAsync(dev, pinned, 4, cudaMemcpyHostToDevice, stream) == cudaSuccess);
  cudaEvent_t event = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&event, cudaEventDisableTiming) == cudaSuccess);
  CHECK(cudaEventQuery(event) == cudaSuccess);  // never recorded: complete
  REQUIRE(cudaEventRecord(event, stream) == cudaSuccess);
  CHECK(cudaEventQuery(event) == cudaErrorNotReady);
  simgpu_release_stream_block(block);
  CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
  CHECK(cudaEventQuery(event) == cudaSuccess);
  char back[4] = {};
  CHECK(cudaMemcpyAsync(back, dev, 4, cudaMemcpyDeviceToHost, stream) == cudaSuccess);  // pageable: synchronous
  CHECK(std::string(back) == "abc");
  cudaEventDestroy(event);
  cudaFreeHost(pinned);
  cudaFree(dev);
  cudaStreamDestroy(stream);
}

TEST_CASE("simgpu: a blocking stream waits for the legacy default stream, a non-blocking one does not", "[simgpu]") {
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  cudaStream_t blocking = nullptr, nonBlocking = nullptr;
  REQUIRE(cudaStreamCreate(&blocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&nonBlocking, cudaStreamNonBlocking) == cudaSuccess);
  const unsigned long compute = simgpu_block_stream(nullptr);  // a long kernel on the default stream
  cudaEvent_t a = nullptr, b = nullptr;
  REQUIRE(cudaEventCreate(&a) == cudaSuccess);
  REQUIRE(cudaEventCreate(&b) == cudaSuccess);
  REQUIRE(cudaEventRecord(a, blocking) == cudaSuccess);
  REQUIRE(cudaEventRecord(b, nonBlocking) == cudaSuccess);
  CHECK(cudaStreamSynchronize(nonBlocking) == cudaSuccess);
  CHECK(cudaEventQuery(b) == cudaSuccess);
  CHECK(cudaEventQuery(a) == cudaErrorNotReady);
  simgpu_release_stream_block(compute);
  CHECK(cudaStreamSynchronize(blocking) == cudaSuccess);
  CHECK(cudaEventQuery(a) == cudaSuccess);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaStreamDestroy(blocking);
  cudaStreamDestroy(nonBlocking);
}

TEST_CASE("simgpu: CUDA_VISIBLE_DEVICES-free process sees DDPRUN_SIMGPU_DEVICES devices (default 4)", "[simgpu]") {
  int count = 0;
  REQUIRE(cudaGetDeviceCount(&count) == cudaSuccess);
  CHECK(count == 4);
  CHECK(cudaSetDevice(4) == cudaErrorInvalidDevice);
  int version = 0;
  REQUIRE(ncclGetVersion(&version) == ncclSuccess);
  CHECK(version == NCCL_VERSION_CODE);
}

namespace {

// Inits `size` communicators from one id on threads, rank r on devices[r]; returns each
// ncclCommGetAsyncError once init ended (non-blocking init) and the communicators.
std::vector<ncclResult_t> initRanks(const std::vector<int>& devices, std::vector<ncclComm_t>& comms) {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  const int size = static_cast<int>(devices.size());
  comms.assign(devices.size(), nullptr);
  std::vector<ncclResult_t> states(devices.size(), ncclInProgress);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      cudaSetDevice(devices[static_cast<std::size_t>(r)]);
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      ncclResult_t rc = ncclCommInitRankConfig(&comms[static_cast<std::size_t>(r)], size, id, r, &config);
      if (rc != ncclInProgress && rc != ncclSuccess) {
        states[static_cast<std::size_t>(r)] = rc;
        return;
      }
      ncclResult_t state = ncclInProgress;
      while (state == ncclInProgress) {
        ncclCommGetAsyncError(comms[static_cast<std::size_t>(r)], &state);
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      states[static_cast<std::size_t>(r)] = state;
    });
  }
  for (auto& t : threads) t.join();
  return states;
}

}  // namespace

TEST_CASE("simgpu nccl api: non-blocking init completes, two ranks on one device are NCCL's duplicate GPU error",
          "[simgpu]") {
  std::vector<ncclComm_t> comms;
  auto states = initRanks({0, 1}, comms);
  CHECK(states == std::vector<ncclResult_t>{ncclSuccess, ncclSuccess});
  for (ncclComm_t c : comms) CHECK(ncclCommDestroy(c) == ncclSuccess);
  states = initRanks({2, 2}, comms);
  CHECK(states == std::vector<ncclResult_t>{ncclInvalidUsage, ncclInvalidUsage});
  CHECK_THAT(std::string(ncclGetLastError(comms[0])), Catch::Matchers::Contains("Duplicate GPU detected"));
  for (ncclComm_t c : comms) CHECK(ncclCommAbort(c) == ncclSuccess);
  CHECK(ncclCommDestroy(comms[0]) == ncclInvalidArgument);  // used after abort: refused, not undefined
}

TEST_CASE("simgpu nccl api: ranks issuing different collectives get ncclInvalidUsage, an abort releases a waiting peer",
          "[simgpu]") {
  std::vector<ncclComm_t> comms;
  REQUIRE(initRanks({0, 1}, comms) == std::vector<ncclResult_t>{ncclSuccess, ncclSuccess});
  std::vector<ncclResult_t> async(2, ncclSuccess);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      cudaSetDevice(r);
      void* buf = nullptr;
      cudaMalloc(&buf, 64);
      // Rank 0 sums 4 floats, rank 1 sums 8: a mismatch.
      ncclAllReduce(buf, buf, r == 0 ? 4 : 8, ncclFloat32, ncclSum, comms[static_cast<std::size_t>(r)], nullptr);
      ncclResult_t state = ncclSuccess;
      for (int i = 0; i < 20000 && state == ncclSuccess; ++i) {
        ncclCommGetAsyncError(comms[static_cast<std::size_t>(r)], &state);
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      async[static_cast<std::size_t>(r)] = state;
      ncclCommAbort(comms[static_cast<std::size_t>(r)]);
      cudaFree(buf);  // returns: the abort ended the collective
    });
  }
  for (auto& t : threads) t.join();
  CHECK(async == std::vector<ncclResult_t>{ncclInvalidUsage, ncclInvalidUsage});

  REQUIRE(initRanks({0, 1}, comms) == std::vector<ncclResult_t>{ncclSuccess, ncclSuccess});
  cudaSetDevice(1);
  void* buf = nullptr;
  REQUIRE(cudaMalloc(&buf, 16) == cudaSuccess);
  REQUIRE(ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, comms[1], nullptr) == ncclSuccess);  // rank 0 never joins
  REQUIRE(ncclCommAbort(comms[0]) == ncclSuccess);
  ncclResult_t state = ncclSuccess;
  for (int i = 0; i < 20000 && state == ncclSuccess; ++i) {
    ncclCommGetAsyncError(comms[1], &state);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK(state == ncclRemoteError);
  CHECK(ncclCommAbort(comms[1]) == ncclSuccess);
  CHECK(cudaFree(buf) == cudaSuccess);
}
