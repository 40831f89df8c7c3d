#include "rendezvous/client/local_rendezvous.h"

#include <spdlog/spdlog.h>

#include "common/error.h"
#include "common/net.h"

namespace ddprun {
namespace {

// One node, closing at once; nothing ever ticks the state, because the only node is this process
// (no heartbeat to miss) and a one-node round never waits for joins.
RendezvousRules singleNodeRules(const LocalRendezvousOptions& options) {
  RendezvousRules rules;
  rules.minNodes = 1;
  rules.maxNodes = 1;
  rules.maxRestarts = options.maxRestarts;
  return rules;
}

}  // namespace

LocalRendezvous::LocalRendezvous(LocalRendezvousOptions options, Post post, PortFinder findPort)
    : options_(std::move(options)),
      post_(std::move(post)),
      findPort_(std::move(findPort)),
      state_("local", singleNodeRules(options_), now()) {
  if (!findPort_) findPort_ = [](const std::string& host) { return findFreePort(host); };
  if (auto invalid = RendezvousState::validateRules(state_.rules())) throw ConfigError(*invalid);
}

Micros LocalRendezvous::now() {
  return std::chrono::duration_cast<Micros>(std::chrono::steady_clock::now().time_since_epoch());
}

void LocalRendezvous::join(RendezvousListener* listener) {
  DDPRUN_CHECK(listener != nullptr, "join needs a listener");
  DDPRUN_CHECK(listener_ == nullptr, "join called twice");
  listener_ = listener;
  NodeInfo node;
  node.nodeId = options_.nodeId;
  node.localWorldSize = options_.localWorldSize;
  node.host = options_.masterAddr;
  node.masterPort = options_.masterPort;
  node.nodeRank = 0;
  deliver(state_.join(node, now()));
}

void LocalRendezvous::reportWorkerFailure(uint64_t round, const WorkerFailure& failure) {
  deliver(state_.workerFailed(options_.nodeId, round, now(), failure));
}

void LocalRendezvous::reportSucceeded(uint64_t round) { deliver(state_.succeeded(options_.nodeId, round, now())); }

void LocalRendezvous::leave() { deliver(state_.leave(options_.nodeId, "stopped by a signal", now())); }

void LocalRendezvous::deliver(std::vector<Notice> notices) {
  for (auto& notice : notices) {
    if (auto* a = std::get_if<RoundAssignment>(&notice.body)) {
      RoundInfo info;
      info.round = a->round;
      info.groupRank = a->groupRank;
      info.groupWorldSize = a->groupWorldSize;
      info.rankOffset = a->rankOffset;
      info.worldSize = a->worldSize;
      info.restartCount = a->restartCount;
      info.masterAddr = a->masterAddr;
      info.masterPort = a->masterPort != 0 ? a->masterPort : findPort_(a->masterAddr);
      post_([listener = listener_, info] { listener->onRoundReady(info); });
    } else if (auto* i = std::get_if<RoundInterruption>(&notice.body)) {
      post_([listener = listener_, round = i->round, reason = i->reason] { listener->onRoundInterrupted(round, reason); });
    } else if (auto* e = std::get_if<JobEnd>(&notice.body)) {
      JobClosure closure{e->succeeded ? JobOutcome::kSucceeded : JobOutcome::kFailed, e->reason, e->failure,
                         e->failedNode};
      post_([listener = listener_, closure] { listener->onJobClosed(closure); });
    } else if (auto* r = std::get_if<Rejection>(&notice.body)) {
      spdlog::debug("rendezvous: report ignored: {}", r->message);
    }
  }
}

}  // namespace ddprun
