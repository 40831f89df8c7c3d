#include "netguard/abuse_guard.h"

#include <algorithm>

namespace ddprun {

bool TokenBucket::take(double n, Clock::time_point now) {
  if (rate_ <= 0) return true;
  if (now > last_) {
    tokens_ = std::min(burst_, tokens_ + std::chrono::duration<double>(now - last_).count() * rate_);
    last_ = now;
  }
  if (tokens_ < n) return false;
  tokens_ -= n;
  return true;
}

std::string callLimit(const AbuseLimits& limits) {
  return "more than " + std::to_string(static_cast<long long>(limits.callBurst)) + " calls at once or " +
         std::to_string(static_cast<long long>(limits.callsPerSecond)) + " a second";
}

bool CallBudget::admit(Clock::time_point now, bool authenticated, const AbuseLimits& limits) {
  if (refused()) return false;
  ++calls_;
  if (!authenticated && ++unauthenticated_ > limits.unauthenticatedCalls) {
    why_ = "more than " + std::to_string(limits.unauthenticatedCalls) + " call(s) without a valid job token";
    return false;
  }
  if (!bucket_.take(1, now)) {
    why_ = callLimit(limits);
    return false;
  }
  return true;
}

bool AddressPenalties::refused(const std::string& address, Clock::time_point now) const {
  auto it = entries_.find(address);
  return it != entries_.end() && now < it->second.until;
}

std::chrono::milliseconds AddressPenalties::offended(const std::string& address, Clock::time_point now,
                                                     const AbuseLimits& limits) {
  if (limits.penalty.count() <= 0) return std::chrono::milliseconds(0);
  auto it = entries_.find(address);
  if (it == entries_.end()) {
    if (entries_.size() >= kMaxAddresses) evictOne();
    it = entries_.emplace(address, Entry{}).first;
  }
  Entry& e = it->second;
  // A repeat while the last penalty runs, or soon after it ended, doubles it.
  const bool repeat = e.last.count() > 0 && now < e.until + limits.maxPenalty;
  e.last = repeat ? std::min(e.last * 2, limits.maxPenalty) : std::min(limits.penalty, limits.maxPenalty);
  e.until = now + e.last;
  return e.last;
}

void AddressPenalties::evictOne() {
  auto first = std::min_element(entries_.begin(), entries_.end(),
                                [](const auto& a, const auto& b) { return a.second.until < b.second.until; });
  if (first != entries_.end()) entries_.erase(first);
}

}  // namespace ddprun
