// At most one log line per interval for an event that outsiders can repeat at will (a refused
// connection, a failed accept, a wrong token): a flood of them must not become a flood of log
// lines (4,690 "accept failed" lines in a second, once). The line that is let through says how
// many were held back since the last one. Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

namespace ddprun {

class LogLimiter {
 public:
  using Clock = std::chrono::steady_clock;

  explicit LogLimiter(std::chrono::milliseconds interval = std::chrono::seconds(10)) : interval_(interval) {}

  // nullopt: hold this one back. Otherwise log it, with the count of lines held back since the
  // last one let through (0 for the first).
  std::optional<uint64_t> allow(Clock::time_point now = Clock::now()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (last_ != Clock::time_point{} && now - last_ < interval_) {
      ++suppressed_;
      return std::nullopt;
    }
    last_ = now;
    const uint64_t held = suppressed_;
    suppressed_ = 0;
    return held;
  }

 private:
  const std::chrono::milliseconds interval_;
  std::mutex mu_;
  Clock::time_point last_{};
  uint64_t suppressed_ = 0;
};

// " (N more like it in the last 10 s)" for a count from allow(), or "".
inline std::string heldBackNote(uint64_t held) {
  return held == 0 ? std::string() : " (" + std::to_string(held) + " more like it since the last such line)";
}

}  // namespace ddprun
