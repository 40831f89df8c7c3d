// The agent's view of a rendezvous: how a node joins a job, learns its round, and reports what
// happened to its workers. Implementations: LocalRendezvous (one node), GrpcRendezvous (the
// client of a rendezvous server) and EtcdRendezvous (the job's state in etcd); all three apply the
// rules of one RendezvousState (rendezvous/rules/).
// Every callback runs on the agent's event loop, never inside the call that caused it.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "common/exit_codes.h"
#include "rendezvous/rules/job_health.h"
#include "rendezvous/rules/node_view.h"

namespace ddprun {

class RendezvousListener {
 public:
  virtual ~RendezvousListener() = default;
  // A round is formed and this node is in it: start the workers.
  virtual void onRoundReady(const RoundInfo& round) = 0;
  // The running round ends for a reason outside this node (a peer failed, a node joined or left):
  // stop the workers and wait for the next onRoundReady.
  virtual void onRoundInterrupted(uint64_t round, const std::string& reason) = 0;
  // This node lost touch with the rendezvous long enough that the server may form a round
  // without it: the workers of `round` must be dead within `killWithin` (fencing,
  // docs/rendezvous.md). The next onRoundReady follows if the node can join again.
  virtual void onFenced(uint64_t round, const std::string& reason, std::chrono::milliseconds killWithin) {
    (void)killWithin;
    onRoundInterrupted(round, reason);
  }
  // The job is over for every node.
  virtual void onJobClosed(const JobClosure& closure) = 0;
  // A rank of `round` on another node exited 0 (the round's first to do so): --finish_timeout
  // starts counting here too.
  virtual void onPeerFinished(uint64_t round, int rank, const std::string& node) {
    (void)round, (void)rank, (void)node;
  }
  // The job-wide health view changed (stragglers across nodes, the longest interval per section).
  virtual void onJobHealth(const JobHealthView& view) { (void)view; }
};

class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  // Joins the job. The listener must outlive this object.
  virtual void join(RendezvousListener* listener) = 0;
  // A local worker of `round` failed (the node's first failure of the round). Leads to the next
  // round while the job's restart budget lasts, else to onJobClosed(kFailed) carrying the job's
  // first failure. A report for an old round is ignored.
  virtual void reportWorkerFailure(uint64_t round, const WorkerFailure& failure) = 0;
  // Every local worker of `round` exited 0 (the exit barrier).
  virtual void reportSucceeded(uint64_t round) = 0;
  // A local worker of `round` exited 0, the node's first to: the rendezvous tells the other
  // members (onPeerFinished), so that --finish_timeout holds job-wide. A backend that cannot
  // relay it ignores it.
  virtual void reportRankFinished(uint64_t round, int rank) { (void)round, (void)rank; }
  // This node's ranks' health (rendezvous/rules/job_health.h), sent with a coming heartbeat when it
  // changed. Any thread. A backend without a job-wide view ignores it.
  virtual void reportHealth(const NodeHealth& health) { (void)health; }
  // No worker of `round` or older runs on this node any more, and none will start: the answer to
  // onRoundInterrupted(round), and after leave(). Other nodes' next round waits for it (the
  // hand-over, docs/rendezvous.md), so the agent sends it as soon as its workers are gone.
  virtual void reportStopped(uint64_t round) = 0;
  // This node stops (a signal): it leaves without closing the job for the others. It is out of
  // the next round at once; reportStopped follows once its workers are gone.
  virtual void leave() = 0;
  // Whether `round` was fenced on this node (its workers are killed because the rendezvous went
  // silent), so that their deaths are not failures of the job. Any thread.
  virtual bool fenced(uint64_t round) const {
    (void)round;
    return false;
  }
  // The job's newest event number this node has heard of (rendezvous/rules/job_event.h), at
  // least that of every notice delivered so far: the order of its timeline. Any thread.
  virtual uint64_t lastEventSeq() const { return 0; }
};

}  // namespace ddprun
