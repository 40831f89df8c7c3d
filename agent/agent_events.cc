#include "agent/agent_events.h"

#include "agent/failure_report.h"  // exitStatusOf

namespace ddprun {

const char* agentEventName(AgentEvent::Kind kind) {
  using K = AgentEvent::Kind;
  switch (kind) {
    case K::kJoining: return "joining";
    case K::kRoundFormed: return "round_formed";
    case K::kWorkerStarted: return "worker_started";
    case K::kWorkerFailed: return "worker_failed";
    case K::kWorkerSucceeded: return "worker_succeeded";
    case K::kRoundInterrupted: return "round_interrupted";
    case K::kFenced: return "fenced";
    case K::kHang: return "hang";
    case K::kStraggler: return "straggler";
    case K::kJobEnded: return "job_ended";
  }
  return "unknown";
}

AgentEvent agentEvent(AgentEvent::Kind kind, uint64_t round, std::string reason) {
  AgentEvent e;
  e.kind = kind;
  e.round = round;
  e.reason = std::move(reason);
  return e;
}

AgentEvent roundFormedEvent(const RoundInfo& round) {
  AgentEvent e = agentEvent(AgentEvent::Kind::kRoundFormed, round.round);
  e.groupRank = round.groupRank;
  e.groupWorldSize = round.groupWorldSize;
  e.worldSize = round.worldSize;
  e.restartCount = round.restartCount;
  e.members = round.members;
  return e;
}

AgentEvent workerEvent(AgentEvent::Kind kind, uint64_t round, const WorkerExit& exit, std::string reason) {
  AgentEvent e = agentEvent(kind, round, std::move(reason));
  e.rank = exit.rank;
  e.localRank = exit.localRank;
  e.pid = exit.pid;
  if (kind == AgentEvent::Kind::kWorkerFailed) {
    e.exitCode = exit.exitCode;
    e.signal = exit.signal;
    e.exitStatus = exitStatusOf(exit);
    e.cause = !exit.hangNote.empty() ? "hang" : exit.signal ? "signal" : "worker_exit";
  }
  return e;
}

}  // namespace ddprun
