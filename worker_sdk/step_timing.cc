#include "worker_sdk/step_timing.h"

#include <mutex>

namespace ddp::detail {
namespace {

// The steps noted since the last take (a heartbeat may skip some: HeartbeatOptions::minInterval).
std::mutex mu;
double sum = 0;
long count = 0;

}  // namespace

void noteStepCompute(double seconds) noexcept {
  if (!(seconds >= 0)) return;
  std::lock_guard<std::mutex> lock(mu);
  sum += seconds;
  ++count;
}

std::optional<double> takeStepCompute() noexcept {
  std::lock_guard<std::mutex> lock(mu);
  if (count == 0) return std::nullopt;
  const double mean = sum / static_cast<double>(count);
  sum = 0;
  count = 0;
  return mean;
}

}  // namespace ddp::detail
