// N ranks as N threads on simulated devices (rank r on device r), each with its own NCCL
// communicator from libddp (ddp_simgpu), over one InProcessStore. Catch2 is not thread-safe:
// bodies record results and throw; the test thread checks them.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdlib>
#include <exception>
#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tests/simgpu/simgpu.h"
#include "tests/support/sdk_ranks.h"
#include "worker_sdk/communicator.h"
#include "worker_sdk/in_process_store.h"

namespace simgpu::test {

using ddp::test::rankEnv;  // rank r of `size` on one node, as the gloo tests use

inline ddp::CommunicatorOptions options(std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  ddp::CommunicatorOptions o;
  o.timeout = timeout;
  return o;
}

// Runs body(comm, rank) on `size` threads; returns each rank's error message ("" when none).
template <typename Body>
std::vector<std::string> runRanks(int size, Body body, const ddp::CommunicatorOptions& o = options()) {
  ddp::InProcessStore store(ddp::InProcessStoreOptions{std::chrono::seconds(60)});
  std::vector<std::string> errors(static_cast<std::size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto comm = ddp::makeCommunicator(ddp::Backend::kNccl, rankEnv(r, size), store, o);
        body(*comm, r);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
        if (errors[static_cast<std::size_t>(r)].empty()) errors[static_cast<std::size_t>(r)] = "(empty message)";
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// Throws std::runtime_error(what) unless ok (assertions inside rank threads).
inline void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

// Device memory of `count` elements of T on the calling thread's current device.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(const std::vector<T>& values) : count_(values.size()) {
    check(cudaMalloc(&ptr_, count_ * sizeof(T)), "cudaMalloc");
    write(values);
  }
  explicit DeviceArray(std::size_t count) : DeviceArray(std::vector<T>(count)) {}
  ~DeviceArray() { cudaFree(ptr_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() { return static_cast<T*>(ptr_); }
  // Pageable copies on the legacy default stream: synchronous.
  void write(const std::vector<T>& values) {
    check(cudaMemcpyAsync(ptr_, values.data(), values.size() * sizeof(T), cudaMemcpyHostToDevice, nullptr), "write");
    check(cudaStreamSynchronize(nullptr), "sync");
  }
  std::vector<T> read() {
    std::vector<T> out(count_);
    check(cudaMemcpyAsync(out.data(), ptr_, count_ * sizeof(T), cudaMemcpyDeviceToHost, nullptr), "read");
    return out;
  }

 private:
  static void check(cudaError_t rc, const char* what) {
    if (rc != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(rc));
  }
  void* ptr_ = nullptr;
  std::size_t count_;
};

// Sets DDPRUN_SIMGPU_* fault variables for one test case, and clears them after it.
class FaultEnv {
 public:
  FaultEnv(std::initializer_list<std::pair<std::string, std::string>> vars) : vars_(vars) {
    for (auto& [k, v] : vars_) setenv(k.c_str(), v.c_str(), 1);
    simgpu_reload_faults();
  }
  ~FaultEnv() {
    for (auto& [k, v] : vars_) unsetenv(k.c_str());
    simgpu_reload_faults();
  }
  FaultEnv(const FaultEnv&) = delete;
  FaultEnv& operator=(const FaultEnv&) = delete;

 private:
  std::vector<std::pair<std::string, std::string>> vars_;
};

}  // namespace simgpu::test
