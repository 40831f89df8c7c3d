// The rules that stop one client from flooding the server with calls: a call budget per
// connection, a cap on calls without a valid token, and a penalty that keeps an offending address
// away for a while. gRPC 1.51 reads every HTTP/2 frame a client sends and creates a call for each
// HEADERS frame however fast they come; a client that opens and at once resets streams (the
// "rapid reset" attack, CVE-2023-44487) grew the daemon by gigabytes in seconds, and gRPC before
// 1.57 has no setting against it. The server's handlers see each call early (before its first
// message) and ask these rules whether the connection may go on; the connection listener closes
// the ones that may not. Pure logic over a caller-supplied clock, so that tests need no time.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>

namespace ddprun {

struct AbuseLimits {
  // New calls (HTTP/2 streams) one connection may start: a token bucket of `callBurst` calls that
  // refills at `callsPerSecond`. ddprun's own clients start one long-lived stream per connection
  // (and a new one after a reconnect), far below this. 0 disables the budget.
  double callsPerSecond = 50;
  double callBurst = 200;
  // Where connections are relayed: the streams a connection may open before its first call with a
  // valid job token (a server with a token only; then it gets callBurst). An attacker with many
  // addresses, whom no per-address penalty stops, gets this many calls into gRPC per connection.
  double untrustedCallBurst = 16;
  // New streams of all connections not trusted yet, together, per second (and at once): beyond
  // it their reading pauses until the budget refills, so that no number of addresses can push
  // calls into gRPC faster than it frees them. Connections trusted (or a server without a token)
  // never wait for it. 0: no such budget.
  double untrustedStreamsPerSecond = 1000;
  // Frames that carry nothing for a call (PING, SETTINGS, RST_STREAM, PRIORITY, CONTINUATION):
  // checked where connections are relayed (connection_relay.h). gRPC clients send a few per
  // second, and bursts of pings while they receive a large value. 0 disables it.
  double controlFramesPerSecond = 1000;
  double controlFrameBurst = 5000;
  // Calls with a missing or wrong job token answered on one connection; the next one closes it.
  // One answer lets an honest client with the wrong token read "invalid job token".
  int unauthenticatedCalls = 1;
  // After a connection was closed for abuse, new connections from its address are refused for
  // `penalty`, doubling for each repeat up to `maxPenalty`; an address quiet for maxPenalty
  // starts again from `penalty`. 0 disables the penalty.
  std::chrono::milliseconds penalty{1000};
  std::chrono::milliseconds maxPenalty{60000};
};

// `perSecond` tokens a second, at most `burst` saved; starts full. rate 0: unlimited.
class TokenBucket {
 public:
  using Clock = std::chrono::steady_clock;
  TokenBucket(double perSecond, double burst, Clock::time_point start)
      : rate_(perSecond), burst_(burst), tokens_(burst), last_(start) {}
  // Takes n tokens if there are that many.
  bool take(double n, Clock::time_point now);

 private:
  double rate_;
  double burst_;
  double tokens_;
  Clock::time_point last_;
};

// "more than 200 calls at once or 50 a second": the call limit in words.
std::string callLimit(const AbuseLimits& limits);

// One connection's calls, as the handlers see them. Not thread-safe: the owner locks.
class CallBudget {
 public:
  using Clock = std::chrono::steady_clock;
  CallBudget(Clock::time_point start, const AbuseLimits& limits)
      : bucket_(limits.callsPerSecond, limits.callBurst, start) {}

  // Whether a new call may go on. A refusal is final: the connection is to be closed.
  bool admit(Clock::time_point now, bool authenticated, const AbuseLimits& limits);
  bool refused() const { return !why_.empty(); }
  // Why the connection was refused ("more than 200 calls at once..."), empty while admitted.
  const std::string& why() const { return why_; }
  uint64_t calls() const { return calls_; }

 private:
  TokenBucket bucket_;
  int unauthenticated_ = 0;
  uint64_t calls_ = 0;
  std::string why_;
};

// Addresses that abused the server, and until when their connections are refused. Bounded: at
// most kMaxAddresses entries, the ones whose penalty ended first are forgotten first. Not
// thread-safe: the owner locks.
class AddressPenalties {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::size_t kMaxAddresses = 10000;

  // Whether a connection from `address` is to be refused now.
  bool refused(const std::string& address, Clock::time_point now) const;
  // `address` abused the server now; returns how long it is refused.
  std::chrono::milliseconds offended(const std::string& address, Clock::time_point now, const AbuseLimits& limits);
  std::size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    Clock::time_point until;
    std::chrono::milliseconds last{0};
  };
  void evictOne();
  std::unordered_map<std::string, Entry> entries_;
};

}  // namespace ddprun
