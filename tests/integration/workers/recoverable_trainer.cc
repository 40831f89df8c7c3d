// A C++ trainer on libddp's in-process recovery (worker_sdk/recovery.h), for
// tests/integration/test_in_process_recovery_cpp.py and bench/recovery_cpp_bench.py: gloo, an
// integer model whose update depends on every step's order (a step skipped, repeated or taken from
// a stale state changes the result), its gradients summed by a GradientReducer built per round.
//
//   recoverable_trainer STEPS STEP_MS
//
// Environment hooks (each a comma-separated list of RANK:STEP[@RESTART], acting only in the round
// whose restart count is RESTART, 0 when absent; a live rank learns it from ddprun's notice, not from
// its process's environment):
//   RECOVERABLE_DIE_AT=RANK:STEP  that rank SIGKILLs itself right after committing STEP
//   RECOVERABLE_HANG_AT=RANK:STEP that rank stops in its own code (sleeps) right after committing STEP
//   RECOVERABLE_PIDS=PATH         each process appends "rank pid restart" when it becomes a rank
//   RECOVERABLE_TIMES=PATH        each rank appends "rank step time" per step done (time: the wall
//                                 clock's seconds), and a dying rank "kill rank step time" first
//                                 (bench/recovery_bench.py's format)
// Rank 0 prints "digest HEX" (of the final parameters) when it is done.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "worker_sdk/ddp.h"
#include "worker_sdk/recovery.h"

namespace {

constexpr std::size_t kParams = 8;
constexpr int64_t kModulus = 1000000007;

int64_t gradient(int64_t step, int rank, std::size_t i) {
  return (step + 1) * (rank + 2) + static_cast<int64_t>(i) * 7 + (step * step) % 5;
}

std::string getenv_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

// Whether RANK:STEP[@RESTART] in `list` names (rank, step) in the round of restart count `restarts`.
bool hook(const std::string& list, int rank, int64_t step, int restarts) {
  const std::string restart = std::to_string(restarts);
  std::size_t start = 0;
  while (start <= list.size()) {
    std::size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    std::string item = list.substr(start, end - start);
    start = end + 1;
    std::string when = "0";
    if (auto at = item.find('@'); at != std::string::npos) {
      when = item.substr(at + 1);
      item.resize(at);
    }
    auto colon = item.find(':');
    if (item.empty() || colon == std::string::npos || when != restart) continue;
    if (std::atoi(item.substr(0, colon).c_str()) == rank && std::atoll(item.substr(colon + 1).c_str()) == step) {
      return true;
    }
  }
  return false;
}

void logStart(int rank, int restarts) {
  const std::string path = getenv_or("RECOVERABLE_PIDS", "");
  if (path.empty()) return;
  if (FILE* f = std::fopen(path.c_str(), "a")) {
    std::fprintf(f, "%d %d %d\n", rank, static_cast<int>(::getpid()), restarts);
    std::fclose(f);
  }
}

// Appends one line to RECOVERABLE_TIMES, if set (opened once per process).
void logTime(const char* prefix, int rank, int64_t step) {
  static FILE* f = [] {
    const std::string path = getenv_or("RECOVERABLE_TIMES", "");
    return path.empty() ? nullptr : std::fopen(path.c_str(), "a");
  }();
  if (!f) return;
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::fprintf(f, "%s%d %" PRId64 " %.6f\n", prefix, rank, step, now);
  std::fflush(f);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: recoverable_trainer STEPS STEP_MS\n");
    return 2;
  }
  const int64_t steps = std::atoll(argv[1]);
  const auto stepTime = std::chrono::milliseconds(std::atoi(argv[2]));
  std::vector<int64_t> params(kParams, 1);
  try {
    ddp::RecoverableOptions options;
    if (ddp::isWarmSpare()) {
      auto env = ddp::waitAsSpare();
      if (!env) return 0;  // the agent is gone: nothing to stand by for
      options.env = *env;
    } else {
      options.env = ddp::Env::fromEnviron();
    }
    options.communicator.timeout = std::chrono::seconds(20);
    options.noticeTimeout = std::chrono::seconds(60);
    const std::string dieAt = getenv_or("RECOVERABLE_DIE_AT", "");
    const std::string hangAt = getenv_or("RECOVERABLE_HANG_AT", "");
    int loggedRank = -1;
    const int recoveries = ddp::runRecoverable(
        options,
        [&](ddp::RecoveryContext& ctx) {
          if (ctx.rank() != loggedRank) {
            logStart(ctx.rank(), ctx.env().restartCount);
            loggedRank = ctx.rank();
          }
          // The round's gradient reducer, over the round's communicator: rebuilt every round, as a
          // DDP wrapper is. Two gradients in two buckets; sums (small integers: exact in float).
          std::vector<float> first(kParams / 2), second(kParams / 2);
          ddp::GradientReducer reducer(ctx.communicator(), {std::span<float>(first), std::span<float>(second)},
                                       ddp::GradientReducerOptions{.bucketCapBytes = 16, .average = false});
          for (int64_t step = ctx.step(); step < steps; ++step) {
            const auto begin = std::chrono::steady_clock::now();
            for (std::size_t i = 0; i < kParams; ++i) {
              (i < kParams / 2 ? first[i] : second[i - kParams / 2]) = static_cast<float>(gradient(step, ctx.rank(), i));
            }
            reducer.markReady(1);  // backward's order: the last registered first
            reducer.markReady(0);
            reducer.finish();
            for (std::size_t i = 0; i < kParams; ++i) {
              const auto sum = static_cast<int64_t>(i < kParams / 2 ? first[i] : second[i - kParams / 2]);
              params[i] = (params[i] * 3 + sum) % kModulus;
            }
            ctx.commit(step + 1);
            logTime("", ctx.rank(), step + 1);
            if (hook(dieAt, ctx.rank(), step + 1, ctx.env().restartCount)) {
              logTime("kill ", ctx.rank(), step + 1);
              ::kill(::getpid(), SIGKILL);
            }
            if (hook(hangAt, ctx.rank(), step + 1, ctx.env().restartCount)) {
              std::this_thread::sleep_for(std::chrono::hours(1));  // hung in its own code
            }
            std::this_thread::sleep_until(begin + stepTime);
          }
          if (ctx.rank() == 0) {
            uint64_t h = 1469598103934665603ull;  // FNV-1a over the parameters
            for (int64_t p : params) {
              for (int b = 0; b < 8; ++b) {
                h ^= static_cast<uint64_t>(p >> (8 * b)) & 0xff;
                h *= 1099511628211ull;
              }
            }
            std::printf("digest %016" PRIx64 "\n", h);
            std::fflush(stdout);
          }
        },
        ddp::RecoveryState{
            .save = [&] { return std::string(reinterpret_cast<const char*>(params.data()), kParams * 8); },
            .load =
                [&](std::string_view bytes) {
                  if (bytes.size() != kParams * 8) throw std::runtime_error("state of a wrong size");
                  std::memcpy(params.data(), bytes.data(), bytes.size());
                }});
    if (recoveries > 0) std::fprintf(stderr, "recoverable_trainer: recovered %d time(s)\n", recoveries);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "recoverable_trainer: %s\n", e.what());
    return 1;
  }
  return 0;
}
