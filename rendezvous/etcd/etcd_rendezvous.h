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

#include "etcd/etcd_client.h"
#include "rendezvous/client/client_core.h"
#include "rendezvous/client/rendezvous.h"

namespace ddprun {

struct EtcdRendezvousOptions : NodeOptions {
  EtcdClientOptions client;
  std::string prefix = "/ddprun";  // key root (torch's rdzv_conf etcd_prefix)
};

// Joins when join() is called; its destructor leaves (revokes this node's lease, deleting its
// keys), and the last node out deletes the job's keys.
std::unique_ptr<Rendezvous> makeEtcdRendezvous(EtcdRendezvousOptions options, ClientCore::Post post);

}  // namespace ddprun
