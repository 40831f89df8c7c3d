// ddprun-etcd-store-bench: a job's store bootstrap on the etcd backend's store (ddp::EtcdStore,
// what workers use under --rdzv_backend=etcd): N ranks, each with its own EtcdStore (its own etcd
// client and channels; ranks are threads of this process), set "addr<rank>" and then wait for
// every rank's key, as a job's ranks publish their addresses and meet. Prints one JSON line per
// repetition: {"ranks": N, "rep": R, "seconds": S} (S: from the start to the last rank through).
// Driven by bench/etcd_store_bench.py, which starts the etcd cluster.
//
//   ddprun-etcd-store-bench --endpoints h:p,h:p,h:p --ranks 8 --reps 5
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "etcd/etcd_client.h"
#include "worker_sdk/etcd_store.h"

int main(int argc, char** argv) {
  std::string endpoints;
  int ranks = 8;
  int reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--endpoints") == 0) endpoints = argv[i + 1];
    else if (std::strcmp(argv[i], "--ranks") == 0) ranks = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--reps") == 0) reps = std::atoi(argv[i + 1]);
  }
  if (endpoints.empty() || ranks < 1 || ranks > 1024 || reps < 1 || reps > 1000) {
    std::fprintf(stderr, "usage: ddprun-etcd-store-bench --endpoints h:p[,h:p...] [--ranks 1..1024] [--reps 1..1000]\n");
    return 2;
  }
  const auto members = ddprun::parseEtcdEndpoints(endpoints);
  const auto run = std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
  for (int rep = 0; rep < reps; ++rep) {
    std::vector<std::unique_ptr<ddp::EtcdStore>> stores;
    for (int r = 0; r < ranks; ++r) {
      ddp::EtcdStoreOptions o;
      o.client.endpoints = members;
      o.client.firstEndpoint = r % static_cast<int>(members.size());  // spread as a job's ranks are
      o.prefix = "/ddprun-bench/" + run + "/round/" + std::to_string(rep) + "/";
      o.timeout = std::chrono::seconds(60);  // safety bound
      stores.push_back(std::make_unique<ddp::EtcdStore>(o));
    }
    std::vector<std::string> keys;
    for (int r = 0; r < ranks; ++r) keys.push_back("addr" + std::to_string(r));
    std::vector<std::string> errors(static_cast<std::size_t>(ranks));
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r) {
      threads.emplace_back([&, r] {
        try {
          stores[static_cast<std::size_t>(r)]->set(keys[static_cast<std::size_t>(r)], "127.0.0.1:" + std::to_string(20000 + r));
          stores[static_cast<std::size_t>(r)]->wait(keys, std::chrono::seconds(60));
        } catch (const std::exception& e) {
          errors[static_cast<std::size_t>(r)] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (const auto& e : errors) {
      if (!e.empty()) {
        std::fprintf(stderr, "ddprun-etcd-store-bench: a rank failed: %s\n", e.c_str());
        return 1;
      }
    }
    std::printf("{\"ranks\": %d, \"rep\": %d, \"seconds\": %.6f}\n", ranks, rep, seconds);
    std::fflush(stdout);
  }
  return 0;
}
