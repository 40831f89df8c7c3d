// Single-node rendezvous: a thin driver of the same RendezvousState the gRPC server runs, as a
// one-node job on this process's monotonic clock. Restart budget, exit barrier, fencing and their
// messages live in the state machine only; this class turns its notices into listener callbacks
// and picks a free master port per round (I/O the rules leave to their host).
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "rendezvous/client/rendezvous.h"
#include "rendezvous/rules/state_machine.h"

namespace ddprun {

struct LocalRendezvousOptions {
  int localWorldSize = 1;
  int maxRestarts = 0;
  std::string masterAddr = "127.0.0.1";
  int masterPort = 0;          // 0: a free port on masterAddr, chosen again for every round
  std::string nodeId = "local";  // how the rules' messages name this node (the host name)
};

class LocalRendezvous final : public Rendezvous {
 public:
  // Callbacks are handed to `post`, which must run them later on the agent's event loop.
  using Post = std::function<void(std::function<void()>)>;
  // Picks the master port for a round; the default binds port 0 on the address.
  using PortFinder = std::function<int(const std::string& host)>;

  LocalRendezvous(LocalRendezvousOptions options, Post post, PortFinder findPort = nullptr);

  void join(RendezvousListener* listener) override;
  void reportWorkerFailure(uint64_t round, const WorkerFailure& failure) override;
  void reportSucceeded(uint64_t round) override;
  // Nothing to hand over: with one node, the agent itself starts a round only after its workers
  // of the last one are gone.
  void reportStopped(uint64_t) override {}
  void leave() override;

 private:
  static Micros now();
  // Posts one callback per notice for this node. Rejections (a report for a round that is over,
  // or after leave) are dropped: they are expected races, not errors, on a single node.
  void deliver(std::vector<Notice> notices);

  LocalRendezvousOptions options_;
  Post post_;
  PortFinder findPort_;
  RendezvousState state_;
  RendezvousListener* listener_ = nullptr;
};

}  // namespace ddprun
