// What happened to a job, as the rules host saw it: the one source that the daemon's metrics, the
// status call and the agents' timelines read (DESIGN.md 8). The rules host numbers each job's
// events (seq, from 1) and stamps them on its own monotonic clock; a reader that needs wall-clock
// time stamps them when it hears them (hosts' clocks differ, the order does not).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/rules/state_machine.h"

namespace ddprun {

// Why a worker group failed or a round restarted: a bounded label set (metrics use it as a label).
enum class EventCause {
  kNone,
  kWorkerExit,  // a worker exited non-zero
  kSignal,      // a worker was killed by a signal
  kHang,        // the agent found a rank hung and stopped it (exit status 124)
  kNodeJoined,  // a node joined a running round that had room (a membership change)
  kNodeLost,    // a member left, or was declared dead
  kFenced,      // a node reported for a round that is no longer running
  kExcluded,    // a node's host was excluded (--exclude_node_after)
};

struct JobEvent {
  enum class Kind {
    kNodeJoined,       // node
    kRoundFormed,      // round, members (by group rank), restartCount, took (since the gathering began)
    kWorkerFailed,     // node, round, failure, cause
    kRoundInterrupted, // round (the one stopped), cause, reason; restartSpent when it drew on the budget
    kNodeLost,         // node, reason (left, stream ended, declared dead, workers never stopped)
    kNodeFenced,       // node, round (the stale one it reported for), reason
    kNodeExcluded,     // node, reason (excluded now, or refused at join because its host is)
    kJobEnded,         // succeeded, reason, exitStatus, failure and node when a worker failure ended it
  };
  uint64_t seq = 0;
  Micros at{0};
  Kind kind = Kind::kNodeJoined;
  std::string node;
  uint64_t round = 0;
  std::vector<std::string> members;
  int restartCount = 0;
  Micros took{0};
  std::optional<WorkerFailure> failure;
  EventCause cause = EventCause::kNone;
  bool restartSpent = false;
  bool succeeded = false;
  int exitStatus = 0;
  std::string reason;
};

// "node_joined", "round_formed", ...: the names of the timeline and the status output.
const char* eventKindName(JobEvent::Kind kind);
// "worker_exit", "signal", "hang", ...; "" for kNone.
const char* eventCauseName(EventCause cause);
// What a worker failure counts as: a hang (the agent's exit status 124 for a rank it stopped),
// a signal, or an exit code.
EventCause causeOf(const WorkerFailure& failure);

}  // namespace ddprun
