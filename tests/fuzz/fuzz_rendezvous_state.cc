// Fuzz target: the rendezvous rules, RendezvousState (rendezvous/rules/state_machine.h), driven by event
// sequences decoded from the input: rules (kept only when validateRules accepts them, as the
// service does), then join / heartbeat / worker failed / succeeded / leave / tick, with six node
// ids, ranks and rounds near the real ones, and time that moves forward by amounts near the rules'
// timeouts. Time is the injected clock, as in the unit tests.
//
// Invariants, after every event:
// - round numbers never decrease and grow by one exactly when a batch carries assignments; the
//   restart count never decreases, grows by at most one and only on a worker failure, never past
//   max_restarts; once closed, a job stays closed and emits nothing but rejections;
// - a batch assigns at most one round: all its assignments name the new round, the phase is
//   running, no node twice, group ranks 0..n-1 once each, n = min(nodes in the job, max) and
//   min <= n; world size, rank offsets, master address/port and restart count are consistent and
//   members() lists the nodes by rank; a static node_rank below n is kept, and a survivor of the
//   previous round keeps its rank when it fits and no static rank claims it;
// - interruptions name the round that was running and reach only its members (by node id) still in
//   the job, once each;
//   JobEnd reaches every node in the job once, in the batch that closes it; success only after
//   every member reported success, a budget failure only when the budget is spent;
// - a rejected event changes nothing; rejections reach only the node that sent the event;
// - tick() before nextDeadline() does nothing; after tick(now) the next deadline is later than now;
//   a gathering job always has a deadline (it can never wait forever).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "rendezvous/rules/state_machine.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

using ddprun::JobEnd;
using ddprun::Micros;
using ddprun::NodeInfo;
using ddprun::Notice;
using ddprun::Rejection;
using ddprun::RejectCode;
using ddprun::RendezvousRules;
using ddprun::RendezvousState;
using ddprun::RoundAssignment;
using ddprun::RoundInterruption;
using ddprun::fuzz::FuzzInput;
using Phase = RendezvousState::Phase;

const std::vector<std::string> kIds = {"a", "b", "c", "d", "e", "f"};

enum class Event { kJoin, kHeartbeat, kFailed, kSucceeded, kLeave, kTick };

class Driver {
 public:
  Driver(FuzzInput& in, RendezvousRules rules) : in_(in), rules_(rules) {
    now_ = Micros(in.u32());
    state_ = std::make_unique<RendezvousState>("job", rules_, now_);
  }

  void run() {
    for (int steps = 0; !in_.empty() && steps < 300; ++steps) {
      advanceTime();
      const std::string id = pickId();
      const uint8_t kind = in_.byte() % 10;
      before_ = snapshot();
      std::vector<Notice> out;
      Event event = Event::kTick;
      if (kind < 2) {
        event = Event::kJoin;
        lastJoin_ = nodeInfo(id);
        out = state_->join(lastJoin_, now_);
      } else if (kind == 2) {
        event = Event::kHeartbeat;
        out = state_->heartbeat(id, now_);
      } else if (kind == 3) {  // every node alive beats, so that rounds can run for a while
        for (const auto& other : kIds) {
          if (state_->hasNode(other)) FUZZ_CHECK(state_->heartbeat(other, now_).empty(), "a member's heartbeat was refused");
        }
        event = Event::kHeartbeat;
      } else if (kind == 4) {
        event = Event::kFailed;
        ddprun::WorkerFailure failure;
        failure.rank = in_.byte();
        failure.exitStatus = 1 + in_.byte() % 255;
        out = state_->workerFailed(id, pickRound(), now_, failure);
      } else if (kind == 5 || kind == 6) {
        event = Event::kSucceeded;
        const uint64_t round = pickRound();
        out = state_->succeeded(id, round, now_);
        if (out.empty() || !std::holds_alternative<Rejection>(out.front().body)) succeeded_.insert(id);
      } else if (kind == 7) {
        event = Event::kLeave;
        out = state_->leave(id, "left", now_);
      } else {
        const auto deadline = state_->nextDeadline();
        out = state_->tick(now_);
        if (!deadline || now_ < *deadline) {
          FUZZ_CHECK(out.empty() && snapshot() == before_, "tick() before nextDeadline() changed something");
        }
        const auto next = state_->nextDeadline();
        FUZZ_CHECK(!next || *next > now_, "after tick(now) a deadline is still due");
      }
      check(event, id, out);
    }
  }

 private:
  struct Snapshot {
    Phase phase;
    uint64_t round;
    int restartCount;
    std::set<std::string> nodes;
    std::vector<std::string> members;
    bool operator==(const Snapshot&) const = default;
  };

  Snapshot snapshot() const {
    Snapshot s{state_->phase(), state_->round(), state_->restartCount(), {}, state_->members()};
    for (const auto& id : kIds) {
      if (state_->hasNode(id)) s.nodes.insert(id);
    }
    return s;
  }

  void advanceTime() {
    const std::vector<Micros> steps = {Micros(0),
                                       Micros(1),
                                       rules_.heartbeatTimeout / 2,
                                       rules_.heartbeatTimeout,
                                       rules_.heartbeatTimeout + Micros(1),
                                       rules_.lastCallTimeout,
                                       rules_.joinTimeout,
                                       Micros(in_.u32())};
    now_ += in_.pick(steps);
  }

  std::string pickId() {
    const std::size_t i = in_.below(kIds.size() + 1);
    return i < kIds.size() ? kIds[i] : std::string();  // "" is a malformed join
  }

  uint64_t pickRound() {
    const uint64_t r = state_->round();
    switch (in_.below(5)) {
      case 0: return r - 1;
      case 1: return r + 1;
      case 2: return in_.u64();
      default: return r;
    }
  }

  NodeInfo nodeInfo(const std::string& id) {
    NodeInfo n;
    n.nodeId = id;
    n.localWorldSize = in_.pick(std::vector<int>{1, 2, 8, 0, 1024, 1025});
    n.host = "host-" + id;
    n.masterPort = in_.pick(std::vector<int>{29500, 29501, 0, 65535, 65536, -1});
    const uint8_t r = in_.byte();
    n.nodeRank = r % 3 == 0 ? static_cast<int>(r / 3 % static_cast<unsigned>(rules_.maxNodes + 2)) - 1 : -1;
    if (r == 255) n.nodeRank = -2;
    n.lastRound = pickRound();
    if (in_.flag()) n.lastRound = 0;
    return n;
  }

  void check(Event event, const std::string& id, const std::vector<Notice>& out) {
    const Snapshot after = snapshot();
    if (event == Event::kJoin && !before_.nodes.count(id) && state_->hasNode(id)) infos_[id] = lastJoin_;
    std::vector<std::pair<std::string, RoundAssignment>> assignments;
    std::vector<std::pair<std::string, RoundInterruption>> interruptions;
    std::vector<std::pair<std::string, JobEnd>> ends;
    std::size_t rejections = 0;
    for (const auto& n : out) {
      if (auto* a = std::get_if<RoundAssignment>(&n.body)) assignments.emplace_back(n.nodeId, *a);
      if (auto* i = std::get_if<RoundInterruption>(&n.body)) interruptions.emplace_back(n.nodeId, *i);
      if (auto* e = std::get_if<JobEnd>(&n.body)) ends.emplace_back(n.nodeId, *e);
      if (auto* r = std::get_if<Rejection>(&n.body)) {
        if (r->code == RejectCode::kEvicted) {
          // A tick tells each node it declares dead, and only such nodes: members before, gone after.
          FUZZ_CHECK(event == Event::kTick, "an eviction outside a tick");
          FUZZ_CHECK(before_.nodes.count(n.nodeId) && !state_->hasNode(n.nodeId), "an eviction of a node that stays or never was");
          continue;
        }
        ++rejections;
        FUZZ_CHECK(n.nodeId == id, "a rejection reached a node that did not send the event");
      }
    }
    if (rejections > 0) {
      FUZZ_CHECK(out.size() == 1 && after == before_, "a rejected event changed the job or emitted more");
    }

    // Rounds, restarts, closing.
    FUZZ_CHECK(after.round >= before_.round && after.round <= before_.round + 1, "round number jumped or went back");
    FUZZ_CHECK((after.round == before_.round + 1) == !assignments.empty(), "a new round without assignments, or the reverse");
    FUZZ_CHECK(after.restartCount >= before_.restartCount && after.restartCount <= before_.restartCount + 1 &&
                   after.restartCount <= rules_.maxRestarts,
               "restart count went back, jumped or passed max_restarts");
    if (after.restartCount > before_.restartCount) FUZZ_CHECK(event == Event::kFailed, "a restart spent without a failure");
    FUZZ_CHECK(state_->isCurrentRound(after.round) == (after.phase == Phase::kRunning), "isCurrentRound disagrees with the phase");
    if (before_.phase == Phase::kClosed) {
      FUZZ_CHECK(after.phase == Phase::kClosed, "a closed job opened again");
      FUZZ_CHECK(assignments.empty() && interruptions.empty() && ends.empty(), "a closed job emitted more than rejections");
    }
    if (after.phase == Phase::kGathering) FUZZ_CHECK(state_->nextDeadline().has_value(), "a gathering job has no deadline");

    // Interruptions: the round that ran, to its members still here, once each.
    std::set<std::string> interrupted;
    for (const auto& [node, i] : interruptions) {
      FUZZ_CHECK(before_.phase == Phase::kRunning && i.round == before_.round, "an interruption names a round that was not running");
      // Members are named by node id, as the exit barrier counts them: a member that left and joined
      // again under its id is told too (its agent ignores a round it is not running).
      const auto& members = before_.members;
      FUZZ_CHECK(std::find(members.begin(), members.end(), node) != members.end() && state_->hasNode(node) &&
                     interrupted.insert(node).second,
                 "an interruption reached a node that is not a member, or twice");
    }

    // The new round (and from here on, its members are the previous round's).
    if (!assignments.empty()) checkRound(assignments, after);

    // The end of the job.
    if (!ends.empty()) {
      FUZZ_CHECK(after.phase == Phase::kClosed && before_.phase != Phase::kClosed, "a JobEnd outside the closing batch");
      std::set<std::string> told;
      for (const auto& [node, e] : ends) {
        FUZZ_CHECK(state_->hasNode(node) && told.insert(node).second, "JobEnd to a node not in the job, or twice");
        if (e.succeeded) {
          for (const auto& [member, rank] : prevRank_) {
            FUZZ_CHECK(succeeded_.count(member), "the job succeeded before every member reported success");
          }
        } else if (event == Event::kFailed) {
          FUZZ_CHECK(after.restartCount == rules_.maxRestarts && e.failure && e.failedNode == id,
                     "a worker failure closed the job with budget left, or without naming the failure");
        }
      }
      FUZZ_CHECK(told == after.nodes, "JobEnd did not reach every node in the job");
    }
    if (before_.phase != Phase::kClosed && after.phase == Phase::kClosed) FUZZ_CHECK(!ends.empty() || after.nodes.empty(), "closed silently");

    // Node bookkeeping for the next event.
    for (auto it = infos_.begin(); it != infos_.end();) {
      it = state_->hasNode(it->first) ? std::next(it) : infos_.erase(it);
    }
    for (auto it = prevRank_.begin(); it != prevRank_.end();) {
      it = state_->hasNode(it->first) ? std::next(it) : prevRank_.erase(it);
    }
  }

  void checkRound(const std::vector<std::pair<std::string, RoundAssignment>>& assignments, const Snapshot& after) {
    FUZZ_CHECK(after.phase == Phase::kRunning, "assignments while not running");
    const int n = static_cast<int>(assignments.size());
    FUZZ_CHECK(n >= rules_.minNodes && n == std::min<int>(static_cast<int>(after.nodes.size()), rules_.maxNodes),
               "a round of " + std::to_string(n) + " with " + std::to_string(after.nodes.size()) + " nodes in the job");
    std::vector<std::string> byRank(n);
    std::set<std::string> seen;
    for (const auto& [node, a] : assignments) {
      FUZZ_CHECK(seen.insert(node).second, "a node is assigned twice in one batch");
      FUZZ_CHECK(state_->hasNode(node), "an assignment to a node not in the job");
      FUZZ_CHECK(a.round == after.round && a.groupWorldSize == n && a.restartCount == after.restartCount,
                 "an assignment names another round, size or restart count");
      FUZZ_CHECK(a.groupRank >= 0 && a.groupRank < n && byRank[a.groupRank].empty(), "group ranks are not 0..n-1 once each");
      byRank[a.groupRank] = node;
    }
    FUZZ_CHECK(state_->members() == byRank, "members() does not list the round's nodes by rank");
    std::set<int> staticRanks;
    for (const auto& node : byRank) {
      if (infos_.at(node).nodeRank >= 0) staticRanks.insert(infos_.at(node).nodeRank);
    }
    int offset = 0, world = 0;
    for (const auto& node : byRank) world += infos_.at(node).localWorldSize;
    for (int rank = 0; rank < n; ++rank) {
      const std::string& node = byRank[rank];
      const RoundAssignment& a =
          std::find_if(assignments.begin(), assignments.end(), [&](const auto& p) { return p.first == node; })->second;
      const NodeInfo& info = infos_.at(node);
      FUZZ_CHECK(a.rankOffset == offset && a.worldSize == world, "rank offsets or world size are inconsistent");
      FUZZ_CHECK(a.masterAddr == infos_.at(byRank[0]).host && a.masterPort == infos_.at(byRank[0]).masterPort,
                 "the master is not group rank 0's node");
      offset += info.localWorldSize;
      if (info.nodeRank >= 0 && info.nodeRank < n) FUZZ_CHECK(rank == info.nodeRank, "a static node rank was not kept");
      auto prev = prevRank_.find(node);
      if (info.nodeRank < 0 && prev != prevRank_.end() && prev->second < n && !staticRanks.count(prev->second)) {
        FUZZ_CHECK(rank == prev->second, "a survivor lost its group rank although it fit");
      }
    }
    prevRank_.clear();
    for (int rank = 0; rank < n; ++rank) prevRank_[byRank[rank]] = rank;
    succeeded_.clear();
  }

  FuzzInput& in_;
  const RendezvousRules rules_;
  Micros now_{0};
  std::unique_ptr<RendezvousState> state_;
  Snapshot before_{};
  NodeInfo lastJoin_;
  std::map<std::string, NodeInfo> infos_;   // nodes in the job, as they joined
  std::map<std::string, int> prevRank_;     // members of the last round by rank, while in the job
  std::set<std::string> succeeded_;         // members that reported success in the running round
};

Micros pickTimeout(FuzzInput& in) {
  static const std::vector<uint32_t> ms = {0, 1, 5, 50, 1000, 30000, 600000};
  const std::size_t i = in.below(ms.size() + 1);
  return std::chrono::milliseconds(i < ms.size() ? ms[i] : in.u32());  // the Join carries uint32 ms
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  FuzzInput in(data, size);
  RendezvousRules rules;
  rules.minNodes = in.byte() == 255 ? static_cast<int>(in.u32()) : 1 + in.below(4);
  const int64_t maxNodes = in.byte() == 255 ? static_cast<int>(in.u32()) : int64_t{rules.minNodes} + in.below(4);
  rules.maxNodes = static_cast<int>(std::min<int64_t>(maxNodes, INT32_MAX));
  rules.maxRestarts = static_cast<int>(in.below(5)) - 1;
  rules.joinTimeout = pickTimeout(in);
  rules.lastCallTimeout = pickTimeout(in);
  rules.heartbeatTimeout = pickTimeout(in);
  const bool valid = rules.minNodes >= 1 && rules.maxNodes >= rules.minNodes && rules.maxNodes <= 100000 &&
                     rules.maxRestarts >= 0 && rules.joinTimeout.count() > 0 && rules.heartbeatTimeout.count() > 0 &&
                     rules.lastCallTimeout.count() >= 0;
  const auto problem = RendezvousState::validateRules(rules);
  FUZZ_CHECK(valid == !problem, "validateRules disagrees with the documented bounds");
  if (!problem) Driver(in, rules).run();
  return 0;
}
