// The rules of a multi-node job, as a pure state machine: no I/O, no threads, no clock of its own.
// Every event takes the current time (microseconds on the server's monotonic clock) and returns
// the notices to push to agents. Every multi-node backend drives it through the one rules host
// (rules_host.h): the gRPC service holds one per run id, the etcd backend's elected driver one for
// its job; the single-node LocalRendezvous holds one for its one-node job. Unit tests drive it
// with a fake clock.
//
// Rules (DESIGN.md, "Rendezvous"):
// - A round closes at once when max nodes are in, or last_call_timeout after min nodes joined;
//   join_timeout bounds the wait for min.
// - A node joining a running round that has room makes the round restart, including it. A round
//   that follows an interruption closes at once with whoever is there (if min holds): nobody else
//   is expected, so no last call.
// - A node that leaves (stream gone, no heartbeat within heartbeat_timeout, or a signal) makes the
//   survivors restart into a new round if min still holds; else they wait up to join_timeout.
// - Worker failures spend ONE global restart budget; membership changes do not.
// - Group ranks are deterministic and stable: survivors keep theirs where possible; a static
//   node_rank is the group rank.
// - The round number is a fencing token: reports naming an older round are refused.
// - Hand-over: after an interruption the next round closes only once every member of the old one
//   reported its workers stopped (or is gone), so that no worker of the new round starts on any
//   node while one of the old round still runs on another (a worker saving a checkpoint on
//   SIGTERM, say). A member that leaves by a signal is out of the next round at once but holds it
//   back the same way until its workers are gone. Nodes whose agents do not send the report (an
//   older ddprun) are not waited for; a node that never reports is evicted after join_timeout.
// - The job succeeds when every member of the round reported success (exit barrier), and fails
//   when the budget is spent or min nodes never gathered.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "rendezvous/rules/job_health.h"
#include "rendezvous/rules/worker_failure.h"

namespace ddprun {

using Micros = std::chrono::microseconds;

struct RendezvousRules {
  int minNodes = 1;
  int maxNodes = 1;
  int maxRestarts = 0;
  Micros joinTimeout = std::chrono::seconds(600);
  Micros lastCallTimeout = std::chrono::seconds(30);
  Micros heartbeatTimeout = std::chrono::seconds(5);
  // A node whose workers caused this many failures (the first of each round) is excluded, and its
  // host refused for the job's life; 0: never.
  int excludeNodeAfter = 0;

  bool operator==(const RendezvousRules&) const = default;
};

struct NodeInfo {
  std::string nodeId;
  int localWorldSize = 1;
  std::string host;       // MASTER_ADDR when this node holds group rank 0
  int masterPort = 0;     // free port on this node for rank 0's store
  int nodeRank = -1;      // static group rank, -1 when elastic
  uint64_t lastRound = 0; // the round this node last ran in, 0 for a fresh agent
  bool reportsStopped = false;  // the agent reports its workers stopped after an interruption

  bool operator==(const NodeInfo&) const = default;
};

struct RoundAssignment {
  uint64_t round = 0;
  int groupRank = 0;
  int groupWorldSize = 0;
  int rankOffset = 0;
  int worldSize = 0;
  int restartCount = 0;
  std::string masterAddr;
  int masterPort = 0;
};

struct RoundInterruption {
  uint64_t round = 0;
  std::string reason;
};

// A member's worker exited 0 (the round's first): the other members' --finish_timeout starts.
struct PeerFinish {
  uint64_t round = 0;
  int rank = 0;
  std::string node;
};

struct JobEnd {
  bool succeeded = false;
  std::string reason;
  std::optional<WorkerFailure> failure;  // the worker failure that ended the job, if one did
  std::string failedNode;
};

// kEvicted: the node was declared dead (silent past the heartbeat timeout) and may join again.
// kExcluded: the node's host caused --exclude_node_after failures and is out for the job's life.
enum class RejectCode { kStaleRound, kDuplicateNode, kJobClosed, kRulesMismatch, kMalformed, kNotJoined, kEvicted,
                        kExcluded };

struct Rejection {
  RejectCode code;
  std::string message;
  bool fatal = false;  // the agent's session ends
};

// One message for one node.
struct Notice {
  std::string nodeId;
  std::variant<RoundAssignment, RoundInterruption, JobEnd, Rejection, PeerFinish, JobHealthView> body;
};

class RendezvousState {
 public:
  enum class Phase { kGathering, kRunning, kClosed };

  // Everything a successor needs to go on where this state stands (the etcd backend's driver
  // takeover, docs/etcd.md). Not a rule: restore(snapshot(t), t') behaves as this state would,
  // with deadlines kept as time left (so the successor applies them on its own clock; no two
  // hosts' clocks are compared) and every node counted as seen at t' (its liveness is the
  // backend's business: the successor removes the nodes that are gone).
  struct SnapshotNode {
    NodeInfo info;
    uint64_t joinSeq = 0;
    int groupRank = -1;       // in the running round; -1 for standby nodes
    // The round whose interruption the node has not answered with stopped() yet (0: none).
    uint64_t stoppingRound = 0;
    bool leaving = false;     // said it leaves; waits only for its workers to stop
    bool operator==(const SnapshotNode&) const = default;
  };
  // The job-wide fields of the state, one struct: the snapshot carries it whole, so a field added
  // here cannot be left out of it. Only what is kept on a clock (deadlines, when a node was seen)
  // and the indexes derived from the nodes live beside it.
  struct JobFields {
    std::string runId;
    RendezvousRules rules;
    Phase phase = Phase::kGathering;
    std::vector<std::string> members;          // of the running (or last) round, by group rank
    std::set<std::string> succeededMembers;    // members of the running round that reported success
    bool finishAnnounced = false;              // the running round's first RankFinished was told
    uint64_t round = 0;
    int restartCount = 0;
    uint64_t nextJoinSeq = 0;
    bool closeAtOnce = false;
    // --exclude_node_after, by host (node ids change when an agent restarts; its host does not).
    std::set<std::string> excludedHosts;
    std::map<std::string, int> hostFailures;
    bool operator==(const JobFields&) const = default;
  };
  struct Snapshot {
    JobFields job;
    std::vector<SnapshotNode> nodes;  // by node id
    Micros joinDeadlineLeft{0};
    std::optional<Micros> lastCallDeadlineLeft;
    bool operator==(const Snapshot&) const = default;
  };
  Snapshot snapshot(Micros now) const;
  static RendezvousState restore(const Snapshot& snapshot, Micros now);

  RendezvousState(std::string runId, RendezvousRules rules, Micros now);

  std::vector<Notice> join(const NodeInfo& node, Micros now);
  std::vector<Notice> heartbeat(const std::string& nodeId, Micros now);
  // A node's first worker failure of the round; when it ends the job, every node's JobEnd carries it.
  std::vector<Notice> workerFailed(const std::string& nodeId, uint64_t round, Micros now,
                                   const WorkerFailure& failure = {});
  std::vector<Notice> succeeded(const std::string& nodeId, uint64_t round, Micros now);
  // A member's worker of `round` exited 0. The round's first such report is told to every other
  // member (PeerFinish); later ones say nothing new.
  std::vector<Notice> rankFinished(const std::string& nodeId, uint64_t round, int rank, Micros now);
  // No worker of `round` or older runs on the node any more (its answer to an interruption).
  std::vector<Notice> stopped(const std::string& nodeId, uint64_t round, Micros now);
  // The node is gone: its stream ended, its lease expired, or (saidSo) its agent said it leaves,
  // stopped by a signal. A node that said so while its workers still stop stays until it reports
  // them stopped (hasNode() is then still true), out of every later round.
  std::vector<Notice> leave(const std::string& nodeId, const std::string& reason, Micros now, bool saidSo = false);
  // Applies every deadline that has passed: last call, join timeout, missed heartbeats.
  std::vector<Notice> tick(Micros now);
  // When tick() has work next, if ever.
  std::optional<Micros> nextDeadline() const;

  const RendezvousRules& rules() const { return job_.rules; }
  Phase phase() const { return job_.phase; }
  // A gathering's last call has started (its deadline is set).
  bool lastCallStarted() const { return lastCallDeadline_.has_value(); }
  uint64_t round() const { return job_.round; }
  int restartCount() const { return job_.restartCount; }
  bool isCurrentRound(uint64_t round) const { return job_.phase == Phase::kRunning && round == job_.round; }
  bool hasNode(const std::string& nodeId) const { return nodes_.count(nodeId) != 0; }
  // In the job and not leaving: a candidate for the next round.
  bool isPresent(const std::string& nodeId) const {
    auto it = nodes_.find(nodeId);
    return it != nodes_.end() && !it->second.leaving;
  }
  // Members of the running (or last) round, by group rank.
  const std::vector<std::string>& members() const { return job_.members; }

  // What a node is doing, for the status call and the metrics (no rule depends on it).
  enum class NodeState {
    kRunning,    // a member of the running round
    kStandby,    // in the job, not in the running round (it is full)
    kGathering,  // waiting for the next round to form
    kStopping,   // an interrupted round's workers may still run there
    kLeaving,    // said it leaves, waits for its workers to stop
    kCount
  };
  struct NodeStatus {
    std::string nodeId;
    std::string host;
    int groupRank = -1;     // in the running round; -1: standing by or gathering
    Micros lastSeen{0};     // its last message, on this state's clock
    NodeState state = NodeState::kGathering;
  };
  // At most `limit` nodes, by node id; nodeCount() says how many there are.
  std::vector<NodeStatus> nodeStatus(std::size_t limit) const;
  // How many nodes are in each state (by NodeState), without copying any (a scrape of a
  // 10,000-node job walks them under the service's lock).
  std::array<int, static_cast<std::size_t>(NodeState::kCount)> nodeCountsByState() const;
  std::size_t nodeCount() const { return nodes_.size(); }
  // When the node was last heard from; nullopt when it is not in the job.
  std::optional<Micros> lastSeen(const std::string& nodeId) const;

  // Rules that a Join may carry; nullopt when valid, else the reason.
  static std::optional<std::string> validateRules(const RendezvousRules& rules);
  // "nnodes 2..2 here, 1..4 in the job; max_restarts 0 here, 3 in the job": what a node refused
  // for other rules needs to see (empty when they are equal).
  static std::string rulesDifference(const RendezvousRules& mine, const RendezvousRules& job);

 private:
  // A node: what a snapshot carries of it, and when it was last heard from (on this state's clock).
  struct Node : SnapshotNode {
    Micros lastSeen{0};
    Micros stoppingSince{0};  // since when its stopped() is awaited
  };

  NodeState stateOf(const Node& node) const;
  void beginGathering(Micros now, bool closeAtOnce);
  void maybeCloseGathering(Micros now, std::vector<Notice>* out);
  void closeRound(std::vector<Notice>* out);
  void interruptRound(const std::string& reason, Micros now, std::vector<Notice>* out);
  // Nodes that are in the job and not leaving.
  int presentCount() const;
  Node& addNode(const NodeInfo& info);
  void setLeaving(Node& node);
  void setStopping(Node& node, uint64_t round);
  std::map<std::string, Node>::iterator eraseNode(std::map<std::string, Node>::iterator it);
  // Whether a node's workers of an interrupted round may still run.
  bool anyStopping() const;
  void closeJob(bool succeeded, const std::string& reason, std::vector<Notice>* out,
                const std::optional<WorkerFailure>& failure = std::nullopt, const std::string& failedNode = "");
  // Removes nodes that are gone, then interrupts the round once if any of them still had work.
  void removeNodes(const std::vector<std::string>& nodeIds, const std::string& reason, Micros now,
                   std::vector<Notice>* out);
  std::optional<Rejection> checkReport(const std::string& nodeId, uint64_t round) const;
  void checkBarrier(std::vector<Notice>* out);

  JobFields job_;
  // Changed only through addNode(), setLeaving(), setStopping() and eraseNode(), which keep the
  // counts and the index below: presentCount(), anyStopping() and the taken node ranks are asked
  // on every Join, and a walk over nodes_ there made a gathering of N nodes O(N^2)
  // (bench/RESULTS_MULTINODE.md, finding 1).
  std::map<std::string, Node> nodes_;
  int leavingCount_ = 0;   // nodes with leaving set
  int stoppingCount_ = 0;  // nodes with a stoppingRound
  std::map<int, std::string> byNodeRank_;  // static node ranks taken (NodeInfo::nodeRank >= 0)
  Micros joinDeadline_{0};
  std::optional<Micros> lastCallDeadline_;
};

}  // namespace ddprun
