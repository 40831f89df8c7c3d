// N ranks as N threads, as gloo's own tests run them: each rank gets the environment of rank r of
// `size` on one node and, for runGlooRanks, its own gloo communicator over one InProcessStore and
// loopback TCP. Catch2 is not thread-safe: bodies record results, the test thread checks them.
#pragma once

#include <chrono>
#include <cstddef>
#include <exception>
#include <thread>
#include <vector>

#include "worker_sdk/communicator.h"
#include "worker_sdk/env.h"
#include "worker_sdk/in_process_store.h"

namespace ddp::test {

inline Env rankEnv(int rank, int size) {
  Env env;
  env.rank = rank;
  env.worldSize = size;
  env.localRank = rank;
  env.localWorldSize = size;
  env.masterAddr = "127.0.0.1";
  env.masterPort = 29500;
  return env;
}

inline CommunicatorOptions testOptions(std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  CommunicatorOptions o;
  o.timeout = timeout;
  return o;
}

// Runs body(comm) on `size` threads, each rank with its own gloo communicator; rethrows the
// first rank's error after every thread ended.
template <typename Body>
void runGlooRanks(int size, Body body, const CommunicatorOptions& options = testOptions()) {
  InProcessStore store(InProcessStoreOptions{std::chrono::seconds(30)});
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto comm = makeCommunicator(Backend::kGloo, rankEnv(r, size), store, options);
        body(*comm);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace ddp::test
