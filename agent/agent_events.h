// What happened on one node, as its agent saw it: the one source that the agent's metrics and its
// --timeline file read (DESIGN.md 8). The agent emits them on its event loop; an observer must
// not block (it writes a line, or counts) and must not call back into the agent.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "agent/worker_group.h"          // WorkerExit
#include "rendezvous/rules/node_view.h"  // RoundInfo

namespace ddprun {

struct AgentEvent {
  enum class Kind {
    kJoining,           // the agent asks the rendezvous for a round
    kRoundFormed,       // round, groupRank, groupWorldSize, worldSize, restartCount, members
    kWorkerStarted,     // rank, localRank, pid
    kWorkerFailed,      // rank, localRank, pid, exitCode or signal, exitStatus, reason
    kWorkerSucceeded,   // rank, localRank, pid
    kRoundInterrupted,  // round, reason (a peer failed, a node joined or left...)
    kFenced,            // round, reason: this node lost the rendezvous
    kHang,              // rank, localRank, reason (the diagnosis)
    kStraggler,         // rank, seconds, reason ("on this node" or "across the job", or back to normal)
    kJobEnded,          // exitStatus, reason
  };
  Kind kind = Kind::kJoining;
  // The job's newest event number the node had heard of (Rendezvous::lastEventSeq): with the
  // rendezvous's events it orders the timelines of every node; 0 on a single node.
  uint64_t seq = 0;
  std::chrono::system_clock::time_point time;
  std::string node;  // this node's id in the job (AgentOptions::nodeId), or its host
  uint64_t round = 0;
  int rank = -1;
  int localRank = -1;
  long pid = 0;
  int exitCode = -1;
  int signal = 0;
  int exitStatus = 0;
  int restartCount = 0;
  int groupRank = -1;
  int groupWorldSize = 0;
  int worldSize = 0;
  double seconds = 0;  // kStraggler: the rank's time per step
  bool back = false;   // kStraggler: the rank is back near the median
  std::vector<std::string> members;
  std::string cause;   // kWorkerFailed: "worker_exit", "signal" or "hang"
  std::string reason;
};

// "joining", "round_formed", ...: the names of the timeline.
const char* agentEventName(AgentEvent::Kind kind);

// The events the agent builds from its own types.
AgentEvent agentEvent(AgentEvent::Kind kind, uint64_t round, std::string reason = {});
AgentEvent roundFormedEvent(const RoundInfo& round);
// kWorkerStarted, kWorkerSucceeded, kWorkerFailed (with its cause and exit status), kHang.
AgentEvent workerEvent(AgentEvent::Kind kind, uint64_t round, const WorkerExit& exit, std::string reason = {});

class AgentObserver {
 public:
  virtual ~AgentObserver() = default;
  virtual void onEvent(const AgentEvent& event) = 0;
  // A rank reported a step (its heartbeat) taking `seconds` of its own work: step time and
  // heartbeat age per rank.
  virtual void onStep(int localRank, double seconds) { (void)localRank, (void)seconds; }
};

}  // namespace ddprun
