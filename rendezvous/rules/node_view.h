// What one node learns from the rules: the round it runs in, and how the job ended. Part of the
// rulebook's vocabulary, so that the codec (rendezvous/wire/) can decode them without depending on
// the agents' interface (rendezvous/client/rendezvous.h), which hands them to the agent.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/exit_codes.h"
#include "rendezvous/rules/worker_failure.h"

namespace ddprun {

// What one round of a job looks like from one node.
struct RoundInfo {
  uint64_t round = 0;        // fencing token: grows with every new round of the job
  int groupRank = 0;         // this node's rank among nodes
  int groupWorldSize = 1;    // number of nodes in the round
  int rankOffset = 0;        // global rank of this node's local rank 0
  int worldSize = 1;         // workers in the round, all nodes together
  int restartCount = 0;      // restarts spent so far, the same number on every node
  std::string masterAddr;    // where global rank 0's TCPStore will listen
  int masterPort = 0;
  std::string storeAddr;     // ddprun's store for workers, empty when the backend has none
  std::string storePrefix;
  // The round's nodes by group rank, when the rendezvous says (rounds of at most 64 nodes).
  std::vector<std::string> members;
};

enum class JobOutcome { kSucceeded, kFailed };

// How the job ended, the same for every node.
struct JobClosure {
  JobOutcome outcome = JobOutcome::kFailed;
  std::string reason;
  // The worker failure that ended the job (the first the rendezvous saw), and its node; every
  // agent exits with its status, so that a scheduler sees one exit code for the job.
  std::optional<WorkerFailure> failure;
  std::string failedNode;
  // What the agent exits with when no worker failure decides it: kExitInfrastructure when the
  // rendezvous failed, kExitUsage when it refused this node's configuration (a wrong job token,
  // other rules than the job's, an invalid join), as for a bad command line.
  int exitStatus = kExitInfrastructure;
};

}  // namespace ddprun
