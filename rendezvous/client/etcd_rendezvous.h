// The agent's rendezvous on etcd (--rdzv_backend=etcd|etcd-v2; docs/etcd.md). Every agent joins
// by writing its node key on its own lease; the agents elect one driver (a leased key) that runs
// the one RendezvousState on its own monotonic clock, applies the events the others write to etcd
// and writes each node's notices, which every agent follows through a watch. A dead node's lease
// expires and etcd deletes its key: the driver reads that as the node leaving.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "rendezvous/client/rendezvous.h"
#include "rendezvous/rules/state_machine.h"
#include "etcd/etcd_client.h"

namespace ddprun {

struct EtcdRendezvousOptions {
  EtcdClientOptions client;
  std::string prefix = "/ddprun";  // key root (torch's rdzv_conf etcd_prefix)
  std::string runId;
  std::string nodeId;              // unique per agent process
  int localWorldSize = 1;
  RendezvousRules rules;
  std::string host;                // this node's address for MASTER_ADDR (required: etcd sees no peer)
  int masterPort = 0;
  int nodeRank = -1;
  // Fencing (docs/rendezvous.md, docs/etcd.md): called with the latest time by which this node's
  // workers must be dead unless the node's lease is renewed again (the supervisor hands it to the
  // watchdog, which kills them even if this process is frozen).
  std::function<void(std::chrono::steady_clock::time_point)> onFenceDeadline;
};

class EtcdRendezvous final : public Rendezvous {
 public:
  using Post = std::function<void(std::function<void()>)>;

  EtcdRendezvous(EtcdRendezvousOptions options, Post post);
  // Leaves (revokes this node's lease, deleting its keys); the last node out deletes the job's keys.
  ~EtcdRendezvous() override;

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
