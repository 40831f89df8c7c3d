// The connections the front door handed to gRPC, which knows each only by its descriptor: the
// peer string "fd:N" of its calls. For each: who connected (the rendezvous needs the address),
// its call budget (AbuseLimits), its id in the relay, and whether it was trusted yet.
//
// So that "fd:N" names one connection for as long as late calls of it may still be handled,
// descriptors get numbers from a cursor that goes round the whole descriptor range (F_DUPFD)
// instead of the lowest free one, which a connection that just closed would pass straight to the
// next; and an entry is believed only while its descriptor is still the socket it remembers (its
// inode): gRPC closes a connection's descriptor without telling.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>

#include "common/unique_fd.h"
#include "netguard/abuse_guard.h"

namespace ddprun {

class HandedConnections {
 public:
  using Clock = std::chrono::steady_clock;

  // `firstNumber`: the lowest descriptor number to hand out (above those open at start).
  HandedConnections(AbuseLimits limits, int firstNumber) : limits_(limits), firstNumber_(firstNumber), cursor_(firstNumber) {}

  // What a call's admission asks of the caller, who does it without this object's lock.
  struct Verdict {
    bool admitted = true;
    enum class Then { kNothing, kTrust, kCut } then = Then::kNothing;
    uint64_t relayId = 0;  // for kTrust and kCut
    std::string address;   // for kCut
    std::string why;       // for kCut: "more than 200 calls at once..."
  };

  // Renumbers `fd` (from the cursor) and remembers it: returns the descriptor to hand to gRPC.
  // `relayId` 0: not relayed. `probation`: never trusted by a call (handed from a penalized
  // address where no token is asked). One thread (the front door's accept loop) calls this.
  UniqueFd add(UniqueFd fd, std::string address, uint64_t relayId, bool probation, Clock::time_point now);

  // The client's address of the connection behind a call's peer string; empty when unknown.
  std::string address(const std::string& grpcPeer) const;

  // A call starts on connection `grpcPeer`: counted against its budget. A connection's first
  // authenticated call asks that the relay trust it; the first call over the budget asks that it
  // be cut (an unrelayed one is shut down here, under the lock, while its number surely still is
  // it). Unknown peers are admitted.
  Verdict admit(const std::string& grpcPeer, bool authenticated, Clock::time_point now);

  // Connections handed over whose descriptor is still theirs (entries found gone are dropped:
  // one fstat each).
  std::size_t open();

  // N of "fd:N"; -1 for any other peer string.
  static int fdOfPeer(const std::string& grpcPeer);

 private:
  struct Entry {
    std::string address;
    ino_t inode = 0;
    CallBudget budget;
    uint64_t relayId = 0;
    bool trusted = false;
    bool probation = false;
  };

  UniqueFd renumbered(UniqueFd fd);

  const AbuseLimits limits_;
  const int firstNumber_;
  int cursor_;  // add()'s thread only
  mutable std::mutex mu_;
  std::unordered_map<int, Entry> entries_;
};

}  // namespace ddprun
