#include "netguard/handshake_queue.h"

#include <algorithm>

namespace ddprun {

bool HandshakeQueue::arrive(uint64_t id, const std::string& address, Clock::time_point now) {
  Address& a = addresses_[address];
  if (a.running.size() < options_.perAddress) {
    start(id, a, address, now, now);
    return true;
  }
  a.waiting.push_back(id);
  waitingAddress_.emplace(id, Waiting{address, now});
  return false;
}

void HandshakeQueue::start(uint64_t id, Address& a, const std::string& address, Clock::time_point arrived,
                           Clock::time_point now) {
  a.running.insert(id);
  running_[id] = Running{address, now + options_.timeout, arrived};
  deadlines_.emplace(now + options_.timeout, id);
}

void HandshakeQueue::progressed(uint64_t id, Clock::time_point now) {
  auto it = running_.find(id);
  if (it != running_.end()) it->second.lastHeard = now;
}

std::vector<uint64_t> HandshakeQueue::end(uint64_t id, Clock::time_point now) {
  std::vector<uint64_t> started;
  std::string address;
  if (auto r = running_.find(id); r != running_.end()) {
    address = std::move(r->second.address);
    auto [from, to] = deadlines_.equal_range(r->second.deadline);
    for (auto d = from; d != to; ++d) {
      if (d->second == id) {
        deadlines_.erase(d);
        break;
      }
    }
    running_.erase(r);
    addresses_[address].running.erase(id);
  } else if (auto w = waitingAddress_.find(id); w != waitingAddress_.end()) {
    address = std::move(w->second.address);
    waitingAddress_.erase(w);  // its place in line is skipped when it comes up
  } else {
    return started;
  }
  auto at = addresses_.find(address);
  Address& a = at->second;
  while (a.running.size() < options_.perAddress && !a.waiting.empty()) {
    const uint64_t next = a.waiting.front();
    a.waiting.pop_front();
    auto w = waitingAddress_.find(next);
    if (w == waitingAddress_.end()) continue;  // ended while it waited
    const auto arrived = w->second.arrived;
    waitingAddress_.erase(w);
    start(next, a, address, arrived, now);
    started.push_back(next);
  }
  if (a.running.empty() && a.waiting.empty()) addresses_.erase(at);
  return started;
}

std::vector<HandshakeQueue::Expired> HandshakeQueue::expired(Clock::time_point now) const {
  std::vector<Expired> out;
  std::unordered_set<uint64_t> named;
  for (auto d = deadlines_.begin(); d != deadlines_.end() && d->first <= now; ++d) {
    out.push_back({d->second, Why::kTimedOut});
    named.insert(d->second);
  }
  for (const auto& [address, a] : addresses_) {
    std::size_t waiting = 0;
    for (uint64_t w : a.waiting) waiting += waitingAddress_.count(w);
    if (waiting == 0) continue;
    std::vector<std::pair<Clock::time_point, uint64_t>> silent;
    for (uint64_t id : a.running) {
      const Running& r = running_.at(id);
      if (now - r.lastHeard >= options_.stallGrace && !named.count(id)) silent.emplace_back(r.lastHeard, id);
    }
    std::sort(silent.begin(), silent.end());
    for (std::size_t i = 0; i < silent.size() && i < waiting; ++i) out.push_back({silent[i].second, Why::kStalled});
  }
  return out;
}

HandshakeQueue::Clock::time_point HandshakeQueue::nextCheck() const {
  auto next = deadlines_.empty() ? Clock::time_point::max() : deadlines_.begin()->first;
  if (waitingAddress_.empty()) return next;
  for (const auto& [address, a] : addresses_) {
    if (a.waiting.empty()) continue;
    for (uint64_t id : a.running) next = std::min(next, running_.at(id).lastHeard + options_.stallGrace);
  }
  return next;
}

}  // namespace ddprun
