// What the multi-node clients (gRPC and etcd) share above their transport: the fencing timing
// and the fenced rounds, delivery of the rendezvous's notices to the agent's listener, the one
// way this node's job ends, and the rejoin window. A transport reads notices (a stream, a watch)
// and hands them here; it keeps only what is its own (connections, heartbeats or leases).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "common/backoff.h"
#include "common/exit_codes.h"
#include "ddprun/v1/rendezvous.pb.h"
#include "rendezvous/client/rendezvous.h"
#include "rendezvous/rules/admission.h"  // JoinRequest

namespace ddprun {

// What a node joins with, on either transport (GrpcRendezvousOptions, EtcdRendezvousOptions).
struct NodeOptions {
  std::string runId;
  std::string nodeId;     // unique per agent process
  int localWorldSize = 1;
  RendezvousRules rules;
  // This node's address for MASTER_ADDR. gRPC: empty means as the server sees it; etcd: required
  // (etcd sees no peer).
  std::string host;
  int masterPort = 0;     // free port on this node for rank 0's store
  int nodeRank = -1;      // static group rank, -1 elastic
  // Fencing (docs/rendezvous.md): called, from a rendezvous thread and under no lock, with the
  // latest time by which this node's workers must be dead unless the rendezvous is heard from
  // again (a heartbeat answered, a lease renewed); the supervisor hands it to the watchdog, which
  // kills them even if this process is frozen.
  std::function<void(std::chrono::steady_clock::time_point)> onFenceDeadline;
};

// The Join a node sends: its options, the round it last ran in, and that it reports its workers
// stopped (the hand-over).
JoinRequest joinRequestOf(const NodeOptions& node, uint64_t lastRound);

// The fencing deadlines (docs/rendezvous.md, "Fencing"), as fractions of the heartbeat timeout H,
// measured from the send time of the last message the rendezvous answered (a heartbeat on gRPC,
// a lease renewal on etcd): it cannot have heard from the node before that, so it declares the
// node dead no earlier than that time + H.
struct FenceTiming {
  std::chrono::milliseconds heartbeatInterval;  // H/8: a short freeze of the server must not fence
  std::chrono::milliseconds agentFence;         // 5H/8: the agent stops the workers (SIGTERM)...
  std::chrono::milliseconds agentKill;          // 3H/4: ...and SIGKILLs what is left
  std::chrono::milliseconds watchdogKill;       // 13H/16: the watchdog, if the agent is frozen
  static FenceTiming forHeartbeatTimeout(std::chrono::microseconds heartbeatTimeout);
};

class ClientCore {
 public:
  using Post = std::function<void(std::function<void()>)>;

  ClientCore(Post post, std::chrono::microseconds heartbeatTimeout);

  void setListener(RendezvousListener* listener) { listener_ = listener; }
  const FenceTiming& timing() const { return timing_; }
  // How long a node that lost the rendezvous may take to join again before its job ends (exit
  // 200): 2 x heartbeat_timeout, long enough for the server to notice the old session's end.
  std::chrono::milliseconds rejoinWindow() const { return rejoinWindow_; }

  // The rejoin loop of both transports (docs/rendezvous.md, "Fencing"). A window opens when the
  // node lost the rendezvous: it has until the time returned (now + rejoinWindow()) to join
  // again, and the backoff starts over. Then rejoin() waits a backoff step (jittered, from 100 ms
  // doubling to 1 s; `wait` returns true when this node stops) and tries `attempt` (true: joined
  // again), until the node joined, stopped, its job ended, or the window passed. One thread at a
  // time rejoins (the transport's reader).
  enum class Rejoin { kJoined, kStopped, kWindowPassed };
  std::chrono::steady_clock::time_point openRejoinWindow();
  Rejoin rejoin(std::chrono::steady_clock::time_point deadline, const std::function<bool()>& attempt,
                const std::function<bool(std::chrono::milliseconds)>& wait);
  // Why the job ends for a node whose window passed: "<why>; could not join again within 4s".
  std::string rejoinFailed(const std::string& why) const;

  // The round this node runs in (0 before the first).
  uint64_t round() const { return round_.load(); }
  bool closed() const { return closed_.load(); }
  // Rendezvous::lastEventSeq.
  uint64_t lastEventSeq() const { return eventSeq_.load(std::memory_order_relaxed); }

  // What deliver() did with a notice.
  enum class Delivered { kRound, kInterrupted, kClosed, kWarning, kRefused, kOther };
  // Hands a notice to the listener (through post): a round (its store at storeAddr), an
  // interruption, the end of the job (once), a non-fatal refusal as a warning. A fatal refusal
  // (kRefused) and other kinds (kOther) are left to the transport, which knows what to do.
  Delivered deliver(const v1::ServerMessage& msg, const std::string& storeAddr);

  // Every round up to `round` is fenced here; true when `round` was not yet.
  bool markFenced(uint64_t round);
  // Whether `round` was fenced (its workers' deaths are not failures of the job); contactStale:
  // the transport has not heard from the rendezvous within the agent's fence deadline, so the
  // running round counts as fenced even before its thread noticed.
  bool fenced(uint64_t round, bool contactStale) const;
  // Tells the listener that `round` ends for a reason of the transport's (a lost stream).
  void postInterrupted(uint64_t round, const std::string& why);
  // Tells the listener to kill the workers of `round` within killWithin.
  void postFenced(uint64_t round, const std::string& why, std::chrono::milliseconds killWithin);
  // The job ends for this node (once): the workers of the running round are fenced first when
  // fenceRunning (the transport lost the rendezvous while they ran).
  void fail(const std::string& why, int exitStatus = kExitInfrastructure, bool fenceRunning = false);

 private:
  Post post_;
  RendezvousListener* listener_ = nullptr;
  const FenceTiming timing_;
  const std::chrono::milliseconds rejoinWindow_;
  Backoff rejoinBackoff_{std::chrono::milliseconds(100), std::chrono::milliseconds(1000)};  // rejoining thread only
  std::atomic<uint64_t> round_{0};
  std::atomic<uint64_t> fencedThrough_{0};
  std::atomic<bool> closed_{false};
  std::atomic<uint64_t> eventSeq_{0};  // written by the one thread that delivers
};

}  // namespace ddprun
