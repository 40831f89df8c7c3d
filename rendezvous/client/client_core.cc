#include "rendezvous/client/client_core.h"

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/atomic_max.h"
#include "common/strings.h"
#include "rendezvous/wire/notice_proto.h"

namespace ddprun {

namespace pb = ddprun::v1;

FenceTiming FenceTiming::forHeartbeatTimeout(std::chrono::microseconds heartbeatTimeout) {
  using std::chrono::milliseconds;
  auto h = std::max<int64_t>(std::chrono::duration_cast<milliseconds>(heartbeatTimeout).count(), 16);
  return FenceTiming{milliseconds(std::max<int64_t>(h / 8, 20)), milliseconds(h * 5 / 8), milliseconds(h * 3 / 4),
                     milliseconds(h * 13 / 16)};
}

JoinRequest joinRequestOf(const NodeOptions& o, uint64_t lastRound) {
  JoinRequest request{o.runId, o.rules, {}};
  request.node.nodeId = o.nodeId;
  request.node.localWorldSize = o.localWorldSize;
  request.node.host = o.host;
  request.node.masterPort = o.masterPort;
  request.node.nodeRank = o.nodeRank;
  request.node.lastRound = lastRound;
  request.node.reportsStopped = true;
  return request;
}

ClientCore::ClientCore(Post post, std::chrono::microseconds heartbeatTimeout)
    : post_(std::move(post)),
      timing_(FenceTiming::forHeartbeatTimeout(heartbeatTimeout)),
      rejoinWindow_(2 * std::chrono::duration_cast<std::chrono::milliseconds>(heartbeatTimeout)) {}

ClientCore::Delivered ClientCore::deliver(const pb::ServerMessage& msg, const std::string& storeAddr) {
  // Before the notice is posted: the agent that handles it reads at least its number.
  if (msg.event_seq() > eventSeq_.load(std::memory_order_relaxed)) eventSeq_.store(msg.event_seq(), std::memory_order_relaxed);
  switch (msg.kind_case()) {
    case pb::ServerMessage::kRoundAssigned: {
      RoundInfo info = roundInfoOf(msg.round_assigned(), storeAddr);
      round_ = info.round;
      post_([listener = listener_, info] { listener->onRoundReady(info); });
      return Delivered::kRound;
    }
    case pb::ServerMessage::kRoundInterrupted: {
      auto round = msg.round_interrupted().round();
      auto reason = msg.round_interrupted().reason();
      post_([listener = listener_, round, reason] { listener->onRoundInterrupted(round, reason); });
      return Delivered::kInterrupted;
    }
    case pb::ServerMessage::kJobClosed: {
      if (closed_.exchange(true)) return Delivered::kClosed;
      JobClosure closure = jobClosureOf(msg.job_closed());
      post_([listener = listener_, closure] { listener->onJobClosed(closure); });
      return Delivered::kClosed;
    }
    case pb::ServerMessage::kPeerFinished: {
      const auto& f = msg.peer_finished();
      post_([listener = listener_, round = f.round(), rank = f.rank(), node = printable(f.node(), 256)] {
        listener->onPeerFinished(round, rank, node);
      });
      return Delivered::kOther;
    }
    case pb::ServerMessage::kJobHealth: {
      post_([listener = listener_, view = jobHealthOf(msg.job_health())] { listener->onJobHealth(view); });
      return Delivered::kOther;
    }
    case pb::ServerMessage::kRejected:
      if (msg.rejected().fatal()) return Delivered::kRefused;
      spdlog::warn("rendezvous: {}", msg.rejected().message());
      return Delivered::kWarning;
    default:
      return Delivered::kOther;
  }
}

std::chrono::steady_clock::time_point ClientCore::openRejoinWindow() {
  rejoinBackoff_.reset();
  return std::chrono::steady_clock::now() + rejoinWindow_;
}

ClientCore::Rejoin ClientCore::rejoin(std::chrono::steady_clock::time_point deadline,
                                      const std::function<bool()>& attempt,
                                      const std::function<bool(std::chrono::milliseconds)>& wait) {
  using std::chrono::milliseconds;
  for (;;) {
    if (closed_) return Rejoin::kStopped;  // the job ended meanwhile: nothing left to join
    const auto left = std::chrono::ceil<milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left <= milliseconds::zero()) return Rejoin::kWindowPassed;
    if (wait(std::min(rejoinBackoff_.next(), left))) return Rejoin::kStopped;
    if (closed_) return Rejoin::kStopped;
    if (attempt()) return Rejoin::kJoined;
  }
}

std::string ClientCore::rejoinFailed(const std::string& why) const {
  const auto ms = rejoinWindow_.count();
  const std::string window = ms % 1000 == 0 ? fmt::format("{}s", ms / 1000) : fmt::format("{:.1f}s", ms / 1000.0);
  return why + "; could not join again within " + window;
}

bool ClientCore::markFenced(uint64_t round) { return raiseTo(fencedThrough_, round) < round; }

bool ClientCore::fenced(uint64_t round, bool contactStale) const {
  if (round == 0) return false;
  if (contactStale && round == round_.load()) return true;
  return fencedThrough_.load() >= round;
}

void ClientCore::postInterrupted(uint64_t round, const std::string& why) {
  post_([listener = listener_, round, why] { listener->onRoundInterrupted(round, why); });
}

void ClientCore::postFenced(uint64_t round, const std::string& why, std::chrono::milliseconds killWithin) {
  post_([listener = listener_, round, why, killWithin] { listener->onFenced(round, why, killWithin); });
}

void ClientCore::fail(const std::string& why, int exitStatus, bool fenceRunning) {
  if (closed_.exchange(true)) return;
  const uint64_t round = fenceRunning ? round_.load() : 0;
  post_([listener = listener_, round, why, exitStatus] {
    if (round > 0) listener->onFenced(round, why, std::chrono::milliseconds(0));
    listener->onJobClosed(JobClosure{JobOutcome::kFailed, why, {}, {}, exitStatus});
  });
}

}  // namespace ddprun
