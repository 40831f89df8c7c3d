// allreduce_perf: all-reduce bandwidth benchmark for libddp (gloo or nccl backend), in the style
// of nccl-tests' all_reduce_perf. Runs as a worker under ddprun:
//   ddprun ... --nproc_per_node=W allreduce_perf -b 1K -e 256M -f 4 -n 20 -w 5 [-g nccl]
// The buffer is the communicator's staging buffer (host memory for gloo, device memory for nccl),
// so the timed loop moves no data between host and device.
// Each rank fills its buffer with (rank+1) * pattern(i), pattern(i) = 1 + i % 7, and all-reduces
// it in place (float32 sum). The exact result is pattern(i) * W(W+1)/2 (small integers, exact in
// float32). Rank 0 prints one row per size: bytes, count, time (us: the median of -n timed
// iterations after -w warm-up ones, each timed from call to local completion, a barrier before
// the timed loop; the slowest rank's median), algbw = bytes / time, busbw = algbw * 2(W-1)/W, and #wrong (elements,
// summed over ranks, that differ from the exact sum after the last iteration).
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "worker_sdk/ddp.h"

namespace {

std::size_t parseSize(const char* s) {
  char* end = nullptr;
  double v = std::strtod(s, &end);
  std::size_t mult = 1;
  if (end && *end) {
    switch (*end) {
      case 'K': case 'k': mult = 1024; break;
      case 'M': case 'm': mult = 1024 * 1024; break;
      case 'G': case 'g': mult = 1024ull * 1024 * 1024; break;
      default: std::fprintf(stderr, "bad size: %s\n", s); std::exit(2);
    }
  }
  return static_cast<std::size_t>(v * static_cast<double>(mult));
}

float pattern(std::size_t i) { return static_cast<float>(1 + i % 7); }

void usage() {
  std::fprintf(stderr,
               "usage: allreduce_perf [-b minbytes] [-e maxbytes] [-f factor] [-n iters] [-w warmup]\n"
               "                      [-c 0|1 check] [-g gloo|nccl]\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t minBytes = 1024, maxBytes = 256ull << 20;
  double factor = 4;
  int iters = 20, warmup = 5, check = 1;
  std::string backendName = "gloo";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) { usage(); return 2; }
    const char* v = argv[++i];
    if (a == "-b") minBytes = parseSize(v);
    else if (a == "-e") maxBytes = parseSize(v);
    else if (a == "-f") factor = std::atof(v);
    else if (a == "-n") iters = std::atoi(v);
    else if (a == "-w") warmup = std::atoi(v);
    else if (a == "-c") check = std::atoi(v);
    else if (a == "-g") backendName = v;
    else { usage(); return 2; }
  }
  if (factor <= 1 || iters < 1 || warmup < 0 || minBytes < 4 || maxBytes < minBytes) { usage(); return 2; }

  try {
    ddp::Env env = ddp::Env::fromEnviron();
    auto store = ddp::makeStore(env);
    const ddp::Backend backend = ddp::parseBackend(backendName);
    if (const std::string why = ddp::whyBackendUnusable(backend); !why.empty()) {
      std::fprintf(stderr, "allreduce_perf: %s %s\n", backendName.c_str(), why.c_str());
      return 2;
    }
    auto comm = ddp::makeCommunicator(backend, env, *store);
    const int rank = comm->rank(), world = comm->size();
    const double busFactor = world > 1 ? 2.0 * (world - 1) / world : 1.0;

    if (rank == 0) {
      std::printf("# allreduce_perf (libddp %s): world=%d float32 sum, warmup=%d iters=%d (median)\n",
                  backendName.c_str(), world, warmup, iters);
      std::printf("#%12s %12s %12s %10s %10s %8s\n", "size(B)", "count", "time(us)", "algbw(GB/s)",
                  "busbw(GB/s)", "#wrong");
      std::fflush(stdout);
    }

    std::vector<float> host(maxBytes / sizeof(float));
    auto staged = comm->makeStagingBuffer(host.size() * sizeof(float));
    float* device = static_cast<float*>(staged->data());
    const double expectFactor = world * (world + 1) / 2.0;
    for (std::size_t bytes = minBytes; bytes <= maxBytes;
         bytes = std::max(bytes + 4, static_cast<std::size_t>(static_cast<double>(bytes) * factor))) {
      const std::size_t count = bytes / sizeof(float);
      auto fill = [&] {
        for (std::size_t i = 0; i < count; ++i) host[i] = static_cast<float>(rank + 1) * pattern(i);
        staged->copyFromHost(host.data(), count * sizeof(float), 0);
      };
      auto allReduce = [&] { comm->allReduce(device, device, count, ddp::DataType::kFloat32, ddp::ReduceOp::kSum); };
      // Refill before every iteration would add memory traffic to the timed loop; instead the
      // buffer is refilled only before the checked iteration (the last warm-up and timed values
      // grow as W^k, which is harmless for timing: float32 sum takes the same time for any value).
      fill();
      for (int w = 0; w < warmup; ++w) allReduce();
      comm->barrier();
      std::vector<double> times(iters);
      for (int it = 0; it < iters; ++it) {
        auto t0 = std::chrono::steady_clock::now();
        allReduce();
        times[it] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      }
      // Median of the timed iterations (robust on a loaded machine), then the slowest rank's.
      std::sort(times.begin(), times.end());
      double us = iters % 2 ? times[iters / 2] : (times[iters / 2 - 1] + times[iters / 2]) / 2;
      double usMax = us;
      comm->allReduceHost(&usMax, 1, ddp::DataType::kFloat64, ddp::ReduceOp::kMax);

      int64_t wrong = 0;
      if (check) {
        fill();
        allReduce();
        staged->copyToHost(host.data(), count * sizeof(float), 0);
        for (std::size_t i = 0; i < count; ++i) {
          if (host[i] != static_cast<float>(pattern(i) * expectFactor)) ++wrong;
        }
        comm->allReduceHost(&wrong, 1, ddp::DataType::kInt64, ddp::ReduceOp::kSum);
      }
      if (rank == 0) {
        double algbw = static_cast<double>(bytes) / (usMax * 1e3);  // bytes/us = MB/s; /1e3 = GB/s
        std::printf(" %12zu %12zu %12.1f %10.3f %10.3f %8" PRId64 "\n", bytes, count, usMax, algbw,
                    algbw * busFactor, check ? wrong : int64_t{-1});
        std::fflush(stdout);
      }
    }
    comm->barrier();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_perf: %s\n", e.what());
    return 1;
  }
  return 0;
}
