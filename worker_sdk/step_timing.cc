#include "worker_sdk/step_timing.h"

#include <atomic>
#include <cstdint>

namespace ddp::detail {
namespace {

std::atomic<int64_t> lastNanos{-1};

}  // namespace

void noteStepCompute(double seconds) noexcept {
  if (!(seconds >= 0)) return;
  lastNanos.store(static_cast<int64_t>(seconds * 1e9), std::memory_order_relaxed);
}

std::optional<double> takeStepCompute() noexcept {
  const int64_t n = lastNanos.exchange(-1, std::memory_order_relaxed);
  if (n < 0) return std::nullopt;
  return static_cast<double>(n) / 1e9;
}

}  // namespace ddp::detail
