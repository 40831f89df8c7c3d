// Resolve-and-connect by a deadline: the one place every ddprun client that opens its own TCP
// socket (the store's framing, the TLS probe, the rendezvous reachability probe) connects.
#pragma once

#include <chrono>
#include <string>

#include "common/unique_fd.h"

namespace ddprun {

struct Connected {
  enum class Failure { kNone, kResolve, kRefused, kTimeout, kOther };
  UniqueFd fd;  // connected, non-blocking, close-on-exec; empty on failure
  Failure failure = Failure::kNone;
  std::string why;  // for a failure: what went wrong, in words ("connection refused", ...)
};

// Resolves `host` (a name or an address; IPv4 or IPv6) and connects to its addresses in turn
// until one accepts, each attempt bounded by `perAttempt` and all by `deadline`. The failure, when
// every address failed, is the last address's.
Connected connectWithin(const std::string& host, int port, std::chrono::steady_clock::time_point deadline,
                        std::chrono::milliseconds perAttempt = std::chrono::milliseconds::max());

}  // namespace ddprun
