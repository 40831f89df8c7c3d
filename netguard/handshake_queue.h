// The TLS handshakes the relay runs, per client address: at most `perAddress` at once (a flood
// from one address does not take every other address's turn), the rest waiting in order of
// arrival (a mass start behind one NAT address still forms). Bookkeeping only, on the relay's
// thread: no sockets, and the time is the caller's, so the rules are tested with a fake clock
// (tests/unit/handshake_queue_test.cc).
//
// A running handshake ends when it completes or fails, at its deadline (`timeout` from its turn),
// or, while others of its address wait, once its client has sent nothing for `stallGrace`: a
// real client sends its ClientHello as it connects and answers within a round trip, and a slot
// held by a silent one would make everyone behind it wait a whole timeout per batch (1,500
// stalled handshakes delayed a job's agent on the same address by 50 s; issue #37, item 5).
// Silence counts from arrival, not from the turn: a connection that waited its turn with nothing
// sent meanwhile is silent when it starts (the relay reads what it sent as it starts).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace ddprun {

class HandshakeQueue {
 public:
  using Clock = std::chrono::steady_clock;
  struct Options {
    std::size_t perAddress = 256;
    std::chrono::milliseconds timeout{std::chrono::seconds(10)};
    std::chrono::milliseconds stallGrace{std::chrono::seconds(1)};
  };
  enum class Why { kTimedOut, kStalled };
  struct Expired {
    uint64_t id;
    Why why;
  };

  explicit HandshakeQueue(Options options) : options_(options) {}

  // Connection `id` from `address` starts a handshake: true when it runs now, false when it waits.
  bool arrive(uint64_t id, const std::string& address, Clock::time_point now);
  // Its client sent bytes: the running handshake is not stalled.
  void progressed(uint64_t id, Clock::time_point now);
  // Its handshake is over (done, failed, closed; running or waiting, or unknown: ignored). Returns
  // the waiting handshakes that run from now on, in order.
  std::vector<uint64_t> end(uint64_t id, Clock::time_point now);
  // The running handshakes to close now: past their deadline, or stalled while others of their
  // address wait (as many as wait, the longest silent first). They still run until end(id).
  std::vector<Expired> expired(Clock::time_point now) const;
  // When expired() may next have something: a deadline, or a silent handshake's grace.
  Clock::time_point nextCheck() const;

  std::size_t running() const { return running_.size(); }
  std::size_t waiting() const { return waitingAddress_.size(); }

 private:
  struct Running {
    std::string address;
    Clock::time_point deadline;
    Clock::time_point lastHeard;
  };
  struct Address {
    std::unordered_set<uint64_t> running;
    std::deque<uint64_t> waiting;  // in order of arrival; ended ones are skipped when they come up
  };

  struct Waiting {
    std::string address;
    Clock::time_point arrived;
  };

  void start(uint64_t id, Address& a, const std::string& address, Clock::time_point arrived, Clock::time_point now);

  Options options_;
  std::unordered_map<uint64_t, Running> running_;
  std::unordered_map<uint64_t, Waiting> waitingAddress_;
  std::unordered_map<std::string, Address> addresses_;
  std::multimap<Clock::time_point, uint64_t> deadlines_;  // of the running ones
};

}  // namespace ddprun
