#include "rendezvous/rules/job_event.h"

#include "common/exit_codes.h"

namespace ddprun {

const char* eventKindName(JobEvent::Kind kind) {
  using K = JobEvent::Kind;
  switch (kind) {
    case K::kNodeJoined: return "node_joined";
    case K::kRoundFormed: return "round_formed";
    case K::kWorkerFailed: return "worker_failed";
    case K::kRoundInterrupted: return "round_interrupted";
    case K::kNodeLost: return "node_lost";
    case K::kNodeFenced: return "node_fenced";
    case K::kNodeExcluded: return "node_excluded";
    case K::kJobEnded: return "job_ended";
  }
  return "unknown";
}

const char* eventCauseName(EventCause cause) {
  switch (cause) {
    case EventCause::kNone: return "";
    case EventCause::kWorkerExit: return "worker_exit";
    case EventCause::kSignal: return "signal";
    case EventCause::kHang: return "hang";
    case EventCause::kNodeJoined: return "node_joined";
    case EventCause::kNodeLost: return "node_lost";
    case EventCause::kFenced: return "fenced";
    case EventCause::kExcluded: return "excluded";
  }
  return "";
}

EventCause causeOf(const WorkerFailure& failure) {
  // The agent stops a hung rank with a signal and reports 124; a worker that exits 124 itself is
  // an exit code.
  if (failure.exitStatus == kExitHung && failure.exitCode != kExitHung) return EventCause::kHang;
  if (failure.signal > 0) return EventCause::kSignal;
  return EventCause::kWorkerExit;
}

}  // namespace ddprun
