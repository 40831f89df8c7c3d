#include "rendezvous/local_rendezvous.h"

#include "common/error.h"
#include "common/net.h"

namespace ddprun {

LocalRendezvous::LocalRendezvous(LocalRendezvousOptions options, Post post, PortFinder findPort)
    : options_(std::move(options)), post_(std::move(post)), findPort_(std::move(findPort)) {
  if (!findPort_) findPort_ = findFreePort;
}

void LocalRendezvous::join(RendezvousListener* listener) {
  DDPRUN_CHECK(listener != nullptr, "join needs a listener");
  DDPRUN_CHECK(listener_ == nullptr, "join called twice");
  listener_ = listener;
  announceRound();
}

void LocalRendezvous::announceRound() {
  RoundInfo info;
  info.round = round_;
  info.groupRank = 0;
  info.groupWorldSize = 1;
  info.rankOffset = 0;
  info.worldSize = options_.localWorldSize;
  info.restartCount = restartCount_;
  info.masterAddr = options_.masterAddr;
  info.masterPort = options_.masterPort != 0 ? options_.masterPort : findPort_(options_.masterAddr);
  post_([listener = listener_, info] { listener->onRoundReady(info); });
}

void LocalRendezvous::reportWorkerFailure(uint64_t round, const WorkerFailure& failure) {
  if (closed_ || round != round_) return;  // stale report: that round is already over
  if (restartCount_ >= options_.maxRestarts) {
    closed_ = true;
    JobClosure closure;
    closure.reason = options_.maxRestarts == 0 ? "a worker failed and restarts are off (--max_restarts=0)"
                                               : "a worker failed and the restart budget (" +
                                                     std::to_string(options_.maxRestarts) + ") is spent";
    closure.failure = failure;
    post_([listener = listener_, closure] { listener->onJobClosed(closure); });
    return;
  }
  ++restartCount_;
  ++round_;
  announceRound();
}

void LocalRendezvous::reportSucceeded(uint64_t round) {
  if (closed_ || round != round_) return;
  closed_ = true;
  post_([listener = listener_] { listener->onJobClosed(JobClosure{JobOutcome::kSucceeded, "all workers succeeded", {}, {}}); });
}

void LocalRendezvous::leave() { closed_ = true; }

}  // namespace ddprun
