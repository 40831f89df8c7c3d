// Single-node rendezvous: the node is alone in every round, and the restart budget is kept here,
// exactly as a multi-node backend keeps it for the whole job.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "rendezvous/rendezvous.h"

namespace ddprun {

struct LocalRendezvousOptions {
  int localWorldSize = 1;
  int maxRestarts = 0;
  std::string masterAddr = "127.0.0.1";
  int masterPort = 0;  // 0: a free port on masterAddr, chosen again for every round
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
  void leave() override;

 private:
  void announceRound();

  LocalRendezvousOptions options_;
  Post post_;
  PortFinder findPort_;
  RendezvousListener* listener_ = nullptr;
  uint64_t round_ = 0;
  int restartCount_ = 0;
  bool closed_ = false;
};

}  // namespace ddprun
