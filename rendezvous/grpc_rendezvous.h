// The agent's rendezvous backend for multi-node jobs: one Session stream to the rendezvous server
// (embedded in one agent, or the ddprun-rdzv daemon). Server pushes arrive on a reader thread and
// are handed to the agent's event loop through `post`; heartbeats go out from a small thread.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "rendezvous/rendezvous.h"
#include "rendezvous/state_machine.h"

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
  void leave() override;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun
