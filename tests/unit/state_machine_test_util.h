// Helpers of the rendezvous state machine tests: node and rule builders, notices rendered one line
// each, and drivers that join, heartbeat and tick a RendezvousState on a fake clock.
#pragma once

#include "rendezvous/rules/state_machine.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

namespace ddprun::state_machine_test {

using Catch::Matchers::Contains;
using ddprun::JobEnd;
using ddprun::Micros;
using ddprun::NodeInfo;
using ddprun::Notice;
using ddprun::RejectCode;
using ddprun::Rejection;
using ddprun::RendezvousRules;
using ddprun::RendezvousState;
using ddprun::RoundAssignment;
using ddprun::RoundInterruption;
using Phase = RendezvousState::Phase;
using Lines = std::vector<std::string>;

constexpr Micros kUs{1};

inline Micros sec(int64_t n) { return Micros(n * 1000000); }

// Every test node "x" lives on host "host-x" and offers its own port, so a master address names
// exactly one node.
inline std::string hostOf(const std::string& id) { return "host-" + id; }
inline int portOf(const std::string& id) {
  int port = 30000;
  for (char ch : id) port += static_cast<unsigned char>(ch);
  return port;
}

inline NodeInfo nodeInfo(const std::string& id, int localWorldSize = 1, int nodeRank = -1, uint64_t lastRound = 0) {
  NodeInfo n;
  n.nodeId = id;
  n.localWorldSize = localWorldSize;
  n.host = hostOf(id);
  n.masterPort = portOf(id);
  n.nodeRank = nodeRank;
  n.lastRound = lastRound;
  return n;
}

inline std::vector<Notice> join(RendezvousState& s, const std::string& id, Micros now, int localWorldSize = 1,
                         int nodeRank = -1, uint64_t lastRound = 0) {
  return s.join(nodeInfo(id, localWorldSize, nodeRank, lastRound), now);
}

inline RendezvousRules rules(int minNodes, int maxNodes, int maxRestarts = 0) {
  RendezvousRules r;
  r.minNodes = minNodes;
  r.maxNodes = maxNodes;
  r.maxRestarts = maxRestarts;
  r.joinTimeout = sec(600);
  r.lastCallTimeout = sec(30);
  r.heartbeatTimeout = sec(5);
  return r;
}

inline const char* codeName(RejectCode code) {
  switch (code) {
    case RejectCode::kStaleRound: return "stale_round";
    case RejectCode::kDuplicateNode: return "duplicate_node";
    case RejectCode::kJobClosed: return "job_closed";
    case RejectCode::kRulesMismatch: return "rules_mismatch";
    case RejectCode::kMalformed: return "malformed";
    case RejectCode::kNotJoined: return "not_joined";
    case RejectCode::kEvicted: return "evicted";
    case RejectCode::kExcluded: return "excluded";
  }
  return "?";
}

// One line per notice; reasons and messages only when asked (tests check them with Contains).
inline std::string render(const Notice& n, bool withText = false) {
  std::string line = n.nodeId + ": ";
  std::visit(
      [&](const auto& b) {
        using T = std::decay_t<decltype(b)>;
        if constexpr (std::is_same_v<T, RoundAssignment>) {
          line += "assign round=" + std::to_string(b.round) + " rank=" + std::to_string(b.groupRank) + "/" +
                  std::to_string(b.groupWorldSize) + " offset=" + std::to_string(b.rankOffset) +
                  " world=" + std::to_string(b.worldSize) + " restarts=" + std::to_string(b.restartCount) +
                  " master=" + b.masterAddr + ":" + std::to_string(b.masterPort);
        } else if constexpr (std::is_same_v<T, RoundInterruption>) {
          line += "interrupt round=" + std::to_string(b.round);
          if (withText) line += " (" + b.reason + ")";
        } else if constexpr (std::is_same_v<T, JobEnd>) {
          line += b.succeeded ? "end succeeded" : "end failed";
          if (withText) line += " (" + b.reason + ")";
        } else if constexpr (std::is_same_v<T, JobHealthView>) {
          line += "health ranks=" + std::to_string(b.ranks) + " stragglers=";
          for (const auto& st : b.stragglers) line += std::to_string(st.rank) + "@" + st.node + ",";
          for (const auto& [section, longest] : b.sections) {
            line += " " + (section.empty() ? std::string("-") : section) + "=" + std::to_string(longest.count()) + "ms";
          }
        } else if constexpr (std::is_same_v<T, PeerFinish>) {
          line += "peer_finished round=" + std::to_string(b.round) + " rank=" + std::to_string(b.rank) + " node=" + b.node;
        } else {
          line += std::string("reject ") + codeName(b.code) + (b.fatal ? " fatal" : " nonfatal");
          if (withText) line += " (" + b.message + ")";
        }
      },
      n.body);
  return line;
}

inline Lines render(const std::vector<Notice>& out, bool withText = false) {
  Lines lines;
  for (const auto& n : out) lines.push_back(render(n, withText));
  return lines;
}

inline std::string assigned(const std::string& id, uint64_t round, int rank, int size, int offset, int world, int restarts,
                     const std::string& master) {
  return id + ": assign round=" + std::to_string(round) + " rank=" + std::to_string(rank) + "/" +
         std::to_string(size) + " offset=" + std::to_string(offset) + " world=" + std::to_string(world) +
         " restarts=" + std::to_string(restarts) + " master=" + hostOf(master) + ":" + std::to_string(portOf(master));
}
inline std::string interrupted(const std::string& id, uint64_t round) {
  return id + ": interrupt round=" + std::to_string(round);
}
inline std::string ended(const std::string& id, bool succeeded) {
  return id + (succeeded ? ": end succeeded" : ": end failed");
}
inline std::string rejected(const std::string& id, RejectCode code, bool fatal) {
  return id + ": reject " + codeName(code) + (fatal ? " fatal" : " nonfatal");
}

// The bodies of type T addressed to one node, in order.
template <class T>
std::vector<T> bodiesFor(const std::vector<Notice>& out, const std::string& id) {
  std::vector<T> found;
  for (const auto& n : out) {
    if (n.nodeId == id) {
      if (const T* b = std::get_if<T>(&n.body)) found.push_back(*b);
    }
  }
  return found;
}

// The reason (or rejection message) of the first interruption, job end or rejection sent to `id`.
inline std::string textFor(const std::vector<Notice>& out, const std::string& id) {
  for (const auto& n : out) {
    if (n.nodeId != id) continue;
    if (auto* i = std::get_if<RoundInterruption>(&n.body)) return i->reason;
    if (auto* e = std::get_if<JobEnd>(&n.body)) return e->reason;
    if (auto* r = std::get_if<Rejection>(&n.body)) return r->message;
  }
  return "<no text for " + id + ">";
}

inline void append(std::vector<Notice>& all, std::vector<Notice> more) {
  for (auto& n : more) all.push_back(std::move(n));
}

// Heartbeats `ids` and ticks once a second from `from` to `to` (inclusive); returns every notice.
inline std::vector<Notice> keepAlive(RendezvousState& s, const std::vector<std::string>& ids, Micros from, Micros to) {
  std::vector<Notice> all;
  for (Micros t = from; t <= to; t += sec(1)) {
    for (const auto& id : ids) append(all, s.heartbeat(id, t));
    append(all, s.tick(t));
  }
  return all;
}

// A running round 1 of the given nodes (all join at 1s, one local worker each). When fewer than
// max nodes join, the last call runs out at 1s + lastCallTimeout while all of them heartbeat once
// a second, so they were last seen at that instant.
inline void startRound(RendezvousState& s, const std::vector<std::string>& ids) {
  std::vector<Notice> all;
  for (const auto& id : ids) append(all, join(s, id, sec(1)));
  if (s.phase() == Phase::kGathering) append(all, keepAlive(s, ids, sec(2), sec(1) + s.rules().lastCallTimeout));
  REQUIRE(s.phase() == Phase::kRunning);
  REQUIRE(s.round() == 1);
  REQUIRE(s.members() == ids);
  REQUIRE(bodiesFor<RoundAssignment>(all, ids.front()).size() == 1);
}

}  // namespace ddprun::state_machine_test

namespace ddprun::state_machine_test {

// A snapshot with every field away from its default (the round-trip tests: a field left out of
// a copy or a wire form shows as a difference).
inline RendezvousState::Snapshot everyFieldSet() {
  RendezvousState::Snapshot s;
  auto& job = s.job;
  job.runId = "job";
  job.rules = rules(2, 4, 3);
  job.rules.excludeNodeAfter = 2;
  job.phase = Phase::kRunning;
  job.members = {"b", "a"};
  job.succeededMembers = {"b"};
  job.finishAnnounced = true;
  job.round = 7;
  job.restartCount = 2;
  job.nextJoinSeq = 9;
  job.closeAtOnce = true;
  job.excludedHosts = {"host-x"};
  job.hostFailures = {{"host-a", 1}, {"host-x", 2}};
  RendezvousState::SnapshotNode a{nodeInfo("a", 2, -1, 6), 3, 1, 0, false};
  a.info.reportsStopped = true;
  RendezvousState::SnapshotNode b{nodeInfo("b", 1, 0, 7), 5, 0, 0, false};
  RendezvousState::SnapshotNode c{nodeInfo("c"), 8, -1, 6, true};  // a standby that left, still stopping
  c.info.reportsStopped = true;
  s.nodes = {a, b, c};
  s.joinDeadlineLeft = sec(11);
  s.lastCallDeadlineLeft = sec(3);
  return s;
}

}  // namespace ddprun::state_machine_test
