#include "rendezvous/rules/state_machine.h"

#include <algorithm>

#include "rendezvous/rules/admission.h"  // nodeBoundsProblem

namespace ddprun {
namespace {

std::string seconds(Micros t) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t).count();
  return std::to_string(ms / 1000) + "." + std::to_string((ms % 1000) / 100) + "s";
}

Notice reject(const std::string& nodeId, RejectCode code, std::string message, bool fatal) {
  return Notice{nodeId, Rejection{code, std::move(message), fatal}};
}

}  // namespace

std::optional<std::string> RendezvousState::validateRules(const RendezvousRules& r) {
  if (r.minNodes < 1 || r.maxNodes < r.minNodes || r.maxNodes > 100000) {
    return "node counts must satisfy 1 <= min <= max <= 100000 (min " + std::to_string(r.minNodes) + ", max " +
           std::to_string(r.maxNodes) + ")";
  }
  if (r.maxRestarts < 0) return "max_restarts must not be negative";
  if (r.excludeNodeAfter < 0 || r.excludeNodeAfter > 1000000) return "exclude_node_after must be 0 to 1000000";
  if (r.joinTimeout.count() <= 0 || r.heartbeatTimeout.count() <= 0 || r.lastCallTimeout.count() < 0) {
    return "join and heartbeat timeouts must be positive, the last call timeout not negative";
  }
  return std::nullopt;
}

std::string RendezvousState::rulesDifference(const RendezvousRules& mine, const RendezvousRules& job) {
  auto millis = [](Micros t) {
    return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(t).count()) + " ms";
  };
  std::string out;
  auto add = [&](const std::string& name, const std::string& here, const std::string& there) {
    if (here == there) return;
    out += (out.empty() ? "" : "; ") + name + " " + here + " here, " + there + " in the job";
  };
  auto nodes = [](const RendezvousRules& r) { return std::to_string(r.minNodes) + ".." + std::to_string(r.maxNodes); };
  add("nnodes", nodes(mine), nodes(job));
  add("max_restarts", std::to_string(mine.maxRestarts), std::to_string(job.maxRestarts));
  add("join_timeout", millis(mine.joinTimeout), millis(job.joinTimeout));
  add("last_call_timeout", millis(mine.lastCallTimeout), millis(job.lastCallTimeout));
  add("heartbeat_timeout", millis(mine.heartbeatTimeout), millis(job.heartbeatTimeout));
  add("exclude_node_after", std::to_string(mine.excludeNodeAfter), std::to_string(job.excludeNodeAfter));
  return out;
}

RendezvousState::Snapshot RendezvousState::snapshot(Micros now) const {
  Snapshot s;
  s.job = job_;
  for (const auto& [id, node] : nodes_) s.nodes.push_back(static_cast<const SnapshotNode&>(node));
  s.joinDeadlineLeft = joinDeadline_ - now;
  if (lastCallDeadline_) s.lastCallDeadlineLeft = *lastCallDeadline_ - now;
  return s;
}

RendezvousState RendezvousState::restore(const Snapshot& s, Micros now) {
  RendezvousState state(s.job.runId, s.job.rules, now);
  state.job_ = s.job;
  for (const auto& n : s.nodes) {
    Node& node = state.addNode(n.info);
    // Whole, then the two fields that the counts follow go through their setters.
    static_cast<SnapshotNode&>(node) = n;
    node.stoppingRound = 0;
    node.leaving = false;
    state.setStopping(node, n.stoppingRound);
    if (n.leaving) state.setLeaving(node);
    node.lastSeen = now;
    node.stoppingSince = now;
  }
  state.joinDeadline_ = now + s.joinDeadlineLeft;
  state.lastCallDeadline_.reset();
  if (s.lastCallDeadlineLeft) state.lastCallDeadline_ = now + *s.lastCallDeadlineLeft;
  return state;
}

RendezvousState::RendezvousState(std::string runId, RendezvousRules rules, Micros now) {
  job_.runId = std::move(runId);
  job_.rules = rules;
  beginGathering(now, false);
}

void RendezvousState::beginGathering(Micros now, bool closeAtOnce) {
  job_.phase = Phase::kGathering;
  job_.closeAtOnce = closeAtOnce;
  joinDeadline_ = now + job_.rules.joinTimeout;
  lastCallDeadline_.reset();
}

std::vector<Notice> RendezvousState::join(const NodeInfo& node, Micros now) {
  std::vector<Notice> out;
  if (job_.phase == Phase::kClosed) {
    out.push_back(reject(node.nodeId, RejectCode::kJobClosed, "job '" + job_.runId + "' is already over", true));
    return out;
  }
  if (auto problem = nodeBoundsProblem(node, job_.rules)) {
    out.push_back(reject(node.nodeId, RejectCode::kMalformed, "invalid join: " + *problem, true));
    return out;
  }
  if (node.lastRound > job_.round) {
    // The agent ran in a round this state never had: the server lost its state (restarted).
    out.push_back(reject(node.nodeId, RejectCode::kStaleRound,
                         "stale round: this rendezvous has no round " + std::to_string(node.lastRound) +
                             " (the rendezvous server restarted; the job cannot continue)",
                         true));
    return out;
  }
  if (job_.excludedHosts.count(node.host)) {
    out.push_back(reject(node.nodeId, RejectCode::kExcluded,
                         "host " + node.host + " is excluded from job '" + job_.runId + "': its workers caused " +
                             std::to_string(job_.rules.excludeNodeAfter) + " failures (--exclude_node_after)",
                         true));
    return out;
  }
  if (nodes_.count(node.nodeId)) {
    out.push_back(reject(node.nodeId, RejectCode::kDuplicateNode, "node id '" + node.nodeId + "' is already in the job", true));
    return out;
  }
  if (auto taken = byNodeRank_.find(node.nodeRank); node.nodeRank >= 0 && taken != byNodeRank_.end()) {
    out.push_back(reject(node.nodeId, RejectCode::kDuplicateNode,
                         "node rank " + std::to_string(node.nodeRank) + " is already taken by " + taken->second, true));
    return out;
  }
  Node& added = addNode(node);
  added.lastSeen = now;
  added.joinSeq = job_.nextJoinSeq++;

  if (job_.phase == Phase::kGathering) {
    maybeCloseGathering(now, &out);
  } else if (job_.phase == Phase::kRunning && static_cast<int>(job_.members.size()) < job_.rules.maxNodes) {
    interruptRound("node " + node.nodeId + " joined", now, &out);
    beginGathering(now, true);
    maybeCloseGathering(now, &out);
  }
  // Otherwise the round is full: the node stands by until a member leaves.
  return out;
}

std::vector<Notice> RendezvousState::heartbeat(const std::string& nodeId, Micros now) {
  std::vector<Notice> out;
  auto it = nodes_.find(nodeId);
  if (it == nodes_.end()) {
    out.push_back(reject(nodeId, RejectCode::kNotJoined, "heartbeat from a node that is not in the job", true));
    return out;
  }
  it->second.lastSeen = now;
  return out;
}

std::optional<Rejection> RendezvousState::checkReport(const std::string& nodeId, uint64_t round) const {
  auto it = nodes_.find(nodeId);
  if (it == nodes_.end()) return Rejection{RejectCode::kNotJoined, "report from a node that is not in the job", true};
  if (job_.phase != Phase::kRunning || round != job_.round || it->second.groupRank < 0) {
    return Rejection{RejectCode::kStaleRound,
                     "stale round: round " + std::to_string(round) + " is not running (current round " +
                         std::to_string(job_.round) + ")",
                     false};
  }
  return std::nullopt;
}

std::vector<Notice> RendezvousState::workerFailed(const std::string& nodeId, uint64_t round, Micros now,
                                                  const WorkerFailure& failure) {
  std::vector<Notice> out;
  if (auto rejection = checkReport(nodeId, round)) {
    out.push_back(Notice{nodeId, *rejection});
    return out;
  }
  nodes_[nodeId].lastSeen = now;
  if (job_.rules.excludeNodeAfter > 0 && failure.attemptsWithoutProgress == 0) {
    // The first failure of each round counts: later reports of the round are stale by now.
    const std::string host = nodes_[nodeId].info.host.empty() ? nodeId : nodes_[nodeId].info.host;
    constexpr std::size_t kMaxHostsCounted = 100000;  // hosts are bounded by joins; this bounds the map
    if (job_.hostFailures.count(host) || job_.hostFailures.size() < kMaxHostsCounted) {
      const int failures = ++job_.hostFailures[host];
      if (failures >= job_.rules.excludeNodeAfter) {
        // Out for the job's life, and the job goes on without spending a restart: a membership
        // change, in which a standby node takes its place if there is one.
        job_.excludedHosts.insert(host);
        const std::string why = "its workers caused " + std::to_string(failures) + " failures (--exclude_node_after=" +
                                std::to_string(job_.rules.excludeNodeAfter) + ")";
        out.push_back(reject(nodeId, RejectCode::kExcluded,
                             "excluded from job '" + job_.runId + "': host " + host + " " + why, true));
        removeNodes({nodeId}, "node " + nodeId + " (host " + host + ") excluded: " + why, now, &out);
        return out;
      }
    }
  }
  if (failure.attemptsWithoutProgress > 0 && job_.restartCount < job_.rules.maxRestarts) {
    closeJob(false,
             "a worker on node " + nodeId + " failed after " + std::to_string(failure.attemptsWithoutProgress) +
                 " restarts in a row without progress (--stop_without_progress); " +
                 std::to_string(job_.rules.maxRestarts - job_.restartCount) + " of " + std::to_string(job_.rules.maxRestarts) +
                 " restarts left unspent",
             &out, failure, nodeId);
    return out;
  }
  if (job_.restartCount >= job_.rules.maxRestarts) {
    closeJob(false,
             "a worker on node " + nodeId + " failed and " +
                 (job_.rules.maxRestarts == 0 ? std::string("restarts are off (--max_restarts=0)")
                                          : "the restart budget (" + std::to_string(job_.rules.maxRestarts) + ") is spent"),
             &out, failure, nodeId);
    return out;
  }
  ++job_.restartCount;
  interruptRound("a worker on node " + nodeId + " failed (restart " + std::to_string(job_.restartCount) + " of " +
                     std::to_string(job_.rules.maxRestarts) + ")",
                 now, &out);
  beginGathering(now, true);
  maybeCloseGathering(now, &out);
  return out;
}

std::vector<Notice> RendezvousState::succeeded(const std::string& nodeId, uint64_t round, Micros now) {
  std::vector<Notice> out;
  if (auto rejection = checkReport(nodeId, round)) {
    out.push_back(Notice{nodeId, *rejection});
    return out;
  }
  nodes_[nodeId].lastSeen = now;
  job_.succeededMembers.insert(nodeId);
  checkBarrier(&out);
  return out;
}

std::vector<Notice> RendezvousState::rankFinished(const std::string& nodeId, uint64_t round, int rank, Micros now) {
  std::vector<Notice> out;
  if (auto rejection = checkReport(nodeId, round)) {
    out.push_back(Notice{nodeId, *rejection});
    return out;
  }
  nodes_[nodeId].lastSeen = now;
  if (job_.finishAnnounced) return out;
  job_.finishAnnounced = true;
  for (const auto& id : job_.members) {
    if (id != nodeId) out.push_back(Notice{id, PeerFinish{job_.round, rank, nodeId}});
  }
  return out;
}

void RendezvousState::checkBarrier(std::vector<Notice>* out) {
  if (job_.phase != Phase::kRunning) return;
  // By node id: a member that succeeded and then went away (or came back as a standby) is done.
  for (const auto& id : job_.members) {
    if (!job_.succeededMembers.count(id)) return;
  }
  closeJob(true, "every node's workers succeeded", out);
}

std::vector<Notice> RendezvousState::stopped(const std::string& nodeId, uint64_t round, Micros now) {
  std::vector<Notice> out;
  auto it = nodes_.find(nodeId);
  // A late or repeated report (the node was dropped meanwhile, or answers an older interruption)
  // changes nothing.
  if (it == nodes_.end() || it->second.stoppingRound == 0 || round < it->second.stoppingRound) return out;
  setStopping(it->second, 0);
  it->second.lastSeen = now;
  if (it->second.leaving) eraseNode(it);
  if (job_.phase == Phase::kGathering) maybeCloseGathering(now, &out);
  return out;
}

std::vector<Notice> RendezvousState::leave(const std::string& nodeId, const std::string& reason, Micros now,
                                           bool saidSo) {
  std::vector<Notice> out;
  auto it = nodes_.find(nodeId);
  if (saidSo && it != nodes_.end() && it->second.info.reportsStopped && !it->second.leaving && job_.phase != Phase::kClosed) {
    Node& node = it->second;
    const bool runsWorkers = job_.phase == Phase::kRunning && node.groupRank >= 0 && !job_.succeededMembers.count(nodeId);
    if (runsWorkers || node.stoppingRound != 0) {
      // Out of the next round at once; in the job until its workers are gone (stopped()).
      setLeaving(node);
      if (runsWorkers) {
        interruptRound("node " + nodeId + " left: " + reason, now, &out);
        beginGathering(now, true);
      }
      if (job_.phase == Phase::kGathering) maybeCloseGathering(now, &out);
      return out;
    }
  }
  removeNodes({nodeId}, reason, now, &out);
  return out;
}

void RendezvousState::removeNodes(const std::vector<std::string>& nodeIds, const std::string& reason, Micros now,
                                  std::vector<Notice>* out) {
  std::vector<std::string> lostMembers;
  for (const auto& id : nodeIds) {
    auto it = nodes_.find(id);
    if (it == nodes_.end()) continue;
    // A member whose workers already succeeded is done; the others still run toward the barrier.
    if (it->second.groupRank >= 0 && !job_.succeededMembers.count(id)) lostMembers.push_back(id);
    eraseNode(it);
  }
  if (job_.phase == Phase::kClosed) return;
  if (job_.phase == Phase::kRunning && !lostMembers.empty()) {
    std::string who = lostMembers.size() == 1 ? "node " + lostMembers[0] : std::to_string(lostMembers.size()) + " nodes";
    interruptRound(who + " left: " + reason, now, out);
    beginGathering(now, true);
  }
  if (job_.phase == Phase::kGathering) maybeCloseGathering(now, out);
}

std::vector<Notice> RendezvousState::tick(Micros now) {
  std::vector<Notice> out;
  if (job_.phase == Phase::kClosed) return out;
  std::vector<std::string> silent, stuck;
  for (const auto& [id, node] : nodes_) {
    if (now - node.lastSeen > job_.rules.heartbeatTimeout) {
      silent.push_back(id);
    } else if (node.stoppingRound != 0 && now - node.stoppingSince > job_.rules.joinTimeout) {
      stuck.push_back(id);
    }
  }
  // Told first, so that a node that was only slow learns that it is out and joins again as a
  // newcomer instead of running on in a round that has moved on without it.
  auto evict = [&](const std::vector<std::string>& ids, const std::string& why) {
    if (ids.empty()) return;
    for (const auto& id : ids) out.push_back(reject(id, RejectCode::kEvicted, "declared dead: " + why, true));
    removeNodes(ids, why, now, &out);
  };
  evict(silent, "no heartbeat for " + seconds(job_.rules.heartbeatTimeout));
  // An agent that heartbeats but never says its workers stopped would hold the job back for good.
  evict(stuck, "its workers did not stop within the join timeout (" + seconds(job_.rules.joinTimeout) + ")");
  if (job_.phase != Phase::kGathering) return out;
  if (lastCallDeadline_ && now >= *lastCallDeadline_) {
    maybeCloseGathering(now, &out);
  } else if (presentCount() < job_.rules.minNodes && now >= joinDeadline_) {
    closeJob(false,
             "only " + std::to_string(presentCount()) + " of at least " + std::to_string(job_.rules.minNodes) +
                 " nodes joined within the join timeout (" + seconds(job_.rules.joinTimeout) + ")",
             &out);
  }
  return out;
}

std::optional<Micros> RendezvousState::nextDeadline() const {
  if (job_.phase == Phase::kClosed) return std::nullopt;
  std::optional<Micros> next;
  auto consider = [&](Micros t) {
    if (!next || t < *next) next = t;
  };
  for (const auto& [id, node] : nodes_) {
    consider(node.lastSeen + job_.rules.heartbeatTimeout + Micros(1));
    if (node.stoppingRound != 0) consider(node.stoppingSince + job_.rules.joinTimeout + Micros(1));
  }
  if (job_.phase == Phase::kGathering) {
    // A passed last call waits for stopped() (or a node's removal), not for the clock.
    if (lastCallDeadline_ && !anyStopping()) consider(*lastCallDeadline_);
    if (presentCount() < job_.rules.minNodes) consider(joinDeadline_);
  }
  return next;
}

RendezvousState::NodeState RendezvousState::stateOf(const Node& node) const {
  if (node.leaving) return NodeState::kLeaving;
  if (node.stoppingRound != 0) return NodeState::kStopping;
  if (node.groupRank >= 0 && job_.phase == Phase::kRunning) return NodeState::kRunning;
  return job_.phase == Phase::kGathering ? NodeState::kGathering : NodeState::kStandby;
}

std::vector<RendezvousState::NodeStatus> RendezvousState::nodeStatus(std::size_t limit) const {
  std::vector<NodeStatus> out;
  for (const auto& [id, node] : nodes_) {
    if (out.size() >= limit) break;
    out.push_back({id, node.info.host, node.groupRank, node.lastSeen, stateOf(node)});
  }
  return out;
}

std::array<int, static_cast<std::size_t>(RendezvousState::NodeState::kCount)> RendezvousState::nodeCountsByState()
    const {
  std::array<int, static_cast<std::size_t>(NodeState::kCount)> counts{};
  for (const auto& [id, node] : nodes_) ++counts[static_cast<std::size_t>(stateOf(node))];
  return counts;
}

std::optional<Micros> RendezvousState::lastSeen(const std::string& nodeId) const {
  auto it = nodes_.find(nodeId);
  if (it == nodes_.end()) return std::nullopt;
  return it->second.lastSeen;
}

int RendezvousState::presentCount() const { return static_cast<int>(nodes_.size()) - leavingCount_; }

RendezvousState::Node& RendezvousState::addNode(const NodeInfo& info) {
  Node& node = nodes_[info.nodeId];
  node.info = info;
  if (info.nodeRank >= 0) byNodeRank_[info.nodeRank] = info.nodeId;
  return node;
}

void RendezvousState::setLeaving(Node& node) {
  if (!node.leaving) ++leavingCount_;
  node.leaving = true;
}

void RendezvousState::setStopping(Node& node, uint64_t round) {
  stoppingCount_ += (round != 0) - (node.stoppingRound != 0);
  node.stoppingRound = round;
}

std::map<std::string, RendezvousState::Node>::iterator RendezvousState::eraseNode(
    std::map<std::string, Node>::iterator it) {
  if (it->second.leaving) --leavingCount_;
  if (it->second.stoppingRound != 0) --stoppingCount_;
  if (it->second.info.nodeRank >= 0) byNodeRank_.erase(it->second.info.nodeRank);
  return nodes_.erase(it);
}

bool RendezvousState::anyStopping() const { return stoppingCount_ > 0; }

void RendezvousState::maybeCloseGathering(Micros now, std::vector<Notice>* out) {
  const int present = presentCount();
  if (present < job_.rules.minNodes) {
    lastCallDeadline_.reset();  // fell below min again: wait for joins, bounded by join_timeout
    return;
  }
  const bool due = present >= job_.rules.maxNodes || job_.closeAtOnce || (lastCallDeadline_ && now >= *lastCallDeadline_);
  if (!due) {
    if (!lastCallDeadline_) lastCallDeadline_ = now + job_.rules.lastCallTimeout;
    return;
  }
  if (anyStopping()) return;  // the hand-over: stopped() or the node's removal closes it
  closeRound(out);
}

void RendezvousState::closeRound(std::vector<Notice>* out) {
  // Candidates: static ranks first, then previous members by their old rank, then newcomers in
  // join order. The first maxNodes of them form the round.
  std::vector<Node*> candidates;
  for (auto& [id, node] : nodes_) {
    if (!node.leaving) candidates.push_back(&node);
  }
  auto key = [](const Node* n) {
    int cls = n->info.nodeRank >= 0 ? 0 : (n->groupRank >= 0 ? 1 : 2);
    int order = cls == 0 ? n->info.nodeRank : (cls == 1 ? n->groupRank : 0);
    return std::tuple(cls, order, n->joinSeq);
  };
  std::sort(candidates.begin(), candidates.end(), [&](const Node* a, const Node* b) { return key(a) < key(b); });
  if (static_cast<int>(candidates.size()) > job_.rules.maxNodes) candidates.resize(job_.rules.maxNodes);
  const int size = static_cast<int>(candidates.size());

  // Slots: a static rank, or the previous rank when it still fits, is kept; the rest fill holes.
  std::vector<Node*> slots(size, nullptr);
  std::vector<Node*> unplaced;
  for (Node* n : candidates) {
    int wanted = n->info.nodeRank >= 0 ? n->info.nodeRank : n->groupRank;
    if (wanted >= 0 && wanted < size && !slots[wanted]) {
      slots[wanted] = n;
    } else {
      unplaced.push_back(n);
    }
  }
  size_t next = 0;
  for (auto& slot : slots) {
    if (!slot) slot = unplaced[next++];
  }

  for (auto& [id, node] : nodes_) node.groupRank = -1;
  ++job_.round;
  job_.phase = Phase::kRunning;
  lastCallDeadline_.reset();
  job_.succeededMembers.clear();
  job_.finishAnnounced = false;
  job_.members.clear();
  int worldSize = 0;
  for (Node* n : slots) worldSize += n->info.localWorldSize;
  const Node* master = slots[0];
  int offset = 0;
  for (int rank = 0; rank < size; ++rank) {
    Node* n = slots[rank];
    n->groupRank = rank;
    job_.members.push_back(n->info.nodeId);
    RoundAssignment a;
    a.round = job_.round;
    a.groupRank = rank;
    a.groupWorldSize = size;
    a.rankOffset = offset;
    a.worldSize = worldSize;
    a.restartCount = job_.restartCount;
    a.masterAddr = master->info.host;
    a.masterPort = master->info.masterPort;
    out->push_back(Notice{n->info.nodeId, a});
    offset += n->info.localWorldSize;
  }
}

void RendezvousState::interruptRound(const std::string& reason, Micros now, std::vector<Notice>* out) {
  if (job_.phase != Phase::kRunning) return;
  for (const auto& id : job_.members) {
    auto it = nodes_.find(id);
    if (it == nodes_.end()) continue;
    Node& node = it->second;
    // A member whose workers all succeeded has none left to stop.
    if (node.info.reportsStopped && !job_.succeededMembers.count(id)) {
      setStopping(node, job_.round);
      node.stoppingSince = now;
    }
    if (!node.leaving) out->push_back(Notice{id, RoundInterruption{job_.round, reason}});
  }
}

void RendezvousState::closeJob(bool succeeded, const std::string& reason, std::vector<Notice>* out,
                               const std::optional<WorkerFailure>& failure, const std::string& failedNode) {
  job_.phase = Phase::kClosed;
  for (const auto& [id, node] : nodes_) out->push_back(Notice{id, JobEnd{succeeded, reason, failure, failedNode}});
}

}  // namespace ddprun
