// Evidence before the kill (DESIGN.md section 7, docs/supervision.md): once a rank is declared
// hung, the flight recorders of SDK ranks may blame another one (the rank that is behind); the
// Python ranks still running dump their stacks (SIGABRT under PYTHONFAULTHANDLER), awaited at most
// a bound; and the stacks may name the rank behind. Steps on the attempt's group and state; the
// agent owns the timer that waits for the dumps and the decision to stop the group.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>

#include "agent/attempt.h"
#include "agent/worker_group.h"

namespace ddprun {

// SDK ranks: the last collectives of every local rank, read while they still hang, merged into
// the line that names the rank that is behind (agent/hang_attribution.h), added to the attempt's
// diagnosis. Returns `exit`, or the rank behind when it is another one here that still runs.
WorkerExit blameFromFlightRecorders(const WorkerGroup& group, Attempt& attempt, int nprocPerNode, WorkerExit exit);

// Sends SIGABRT to every running rank that can dump its stack, and notes why the others have none.
void requestStackDumps(WorkerGroup& group, Attempt& attempt, int nprocPerNode,
                       const std::function<bool(pid_t)>& canDumpStack, std::chrono::steady_clock::time_point deadline);

// A dump is still awaited: a rank sent SIGABRT still runs, and the deadline has not passed.
bool stackDumpsPending(const WorkerGroup& group, const Attempt& attempt, std::chrono::steady_clock::time_point now);

// Reads the dumps out of the ranks' stderr tails (`waited`: the bound, for "skipped" notes), and
// lets the stacks name the rank behind when the flight recorders did not.
void collectStackDumps(WorkerGroup& group, Attempt& attempt, std::chrono::milliseconds waited);

}  // namespace ddprun
