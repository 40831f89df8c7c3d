// Jittered exponential backoff for retries: each wait is drawn from [base/2, base], and the base
// doubles up to a cap. Clients that lost the same peer at the same moment spread their retries
// instead of hitting the next one together. One object per retry loop (not thread-safe).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>

namespace ddprun {

class Backoff {
 public:
  Backoff(std::chrono::milliseconds first, std::chrono::milliseconds max)
      : first_(first), max_(max), base_(first) {}

  // The next wait; the one after it is twice as long (up to the cap).
  std::chrono::milliseconds next() {
    if (!seeded_) {
      rng_.seed(std::random_device{}());  // here, not in the constructor: most calls never retry
      seeded_ = true;
    }
    const auto base = base_.count();
    base_ = std::min(base_ * 2, max_);
    return std::chrono::milliseconds(std::uniform_int_distribution<int64_t>(base / 2, base)(rng_));
  }
  // Back to the first wait (after a success).
  void reset() { base_ = first_; }

 private:
  std::chrono::milliseconds first_, max_, base_;
  std::mt19937_64 rng_;
  bool seeded_ = false;
};

}  // namespace ddprun
