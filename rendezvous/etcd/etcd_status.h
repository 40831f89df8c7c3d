// The status of a job on the etcd backend, read from etcd itself (docs/etcd.md): the driver's
// snapshot of the rules' state and each node's key and lease. No agent or daemon is asked, so it
// works whichever node drives, and while none does.
#pragma once

#include <chrono>
#include <string>

#include "ddprun/v1/rendezvous.pb.h"
#include "etcd/etcd_client.h"

namespace ddprun {

struct EtcdStatusOptions {
  std::string endpoints;           // h1:2379,h2:2379,... as --rdzv_endpoint says it
  std::string prefix = "/ddprun";  // the job's key root (rdzv_conf etcd_prefix)
  std::string runId;
  std::chrono::milliseconds timeout{10000};
  unsigned maxNodes = 0;           // status_proto.h's statusNodeLimit
  EtcdClientOptions client;        // TLS and users; endpoints are filled in from `endpoints`
};

// The job, or a reply without jobs when etcd holds none of that id. Throws ConnectionError when
// etcd cannot be reached.
v1::StatusReply readEtcdStatus(EtcdStatusOptions options);

}  // namespace ddprun
