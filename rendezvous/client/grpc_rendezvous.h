// The agent's rendezvous backend for multi-node jobs: one Session stream to the rendezvous server
// (embedded in one agent, or the ddprun-rdzv daemon). Server pushes arrive on a reader thread and
// are handed to the agent's event loop through `post`; heartbeats go out from a small thread,
// which also fences the workers when the server stops answering them.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "rendezvous/client/client_core.h"  // FenceTiming
#include "rendezvous/client/rendezvous.h"
#include "rendezvous/rules/state_machine.h"

namespace ddprun {

struct GrpcRendezvousOptions {
  std::string endpoint;        // HOST:PORT of the rendezvous server
  std::string token;           // job token, sent as metadata; never logged
  std::string runId;
  std::string nodeId;          // unique per agent process
  int localWorldSize = 1;
  RendezvousRules rules;
  std::string host;            // this node's address for MASTER_ADDR; empty: as the server sees it
  int masterPort = 0;          // free port on this node for rank 0's store
  int nodeRank = -1;           // static group rank, -1 elastic
  std::chrono::milliseconds connectTimeout{30000};
  // Fencing (docs/rendezvous.md): called, from a rendezvous thread and under no lock, with the
  // latest time by which this node's workers must be dead unless the server is heard from again
  // (the supervisor hands it to the watchdog, which kills them even if this process is frozen).
  std::function<void(std::chrono::steady_clock::time_point)> onFenceDeadline;
};

class GrpcRendezvous final : public Rendezvous {
 public:
  using Post = std::function<void(std::function<void()>)>;

  GrpcRendezvous(GrpcRendezvousOptions options, Post post);
  // Ends the session (the server sees this node leave) and joins its threads.
  ~GrpcRendezvous() override;

  void join(RendezvousListener* listener) override;
  void reportWorkerFailure(uint64_t round, const WorkerFailure& failure) override;
  void reportSucceeded(uint64_t round) override;
  void reportStopped(uint64_t round) override;
  void leave() override;
  bool fenced(uint64_t round) const override;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun
