// torch's store on the etcd backend: the agent's loopback TCPStore (agent/torch_store.h) hands its
// connections' requests to a StoreForwarder whose `call` is EtcdForwarding::call, which runs each
// on the keys of the request's own round in etcd (store/etcd/etcd_key_store.h), the same keys
// libddp's workers use there. There is no ddprun server in that job: the store lives in etcd, so it
// outlives every rank and every node, and etcd's own replication makes it highly available.
//
// Fencing: each request names its round (the agent binds every connection to the round it was
// admitted in); a round's store is fenced by its round marker, which the etcd driver deletes with
// the round's keys when the next round starts, so an old round's requests fail (the connection is
// closed: TCPStore has no error reply) and never read the new round's keys.
//
// Bounds: keys and values as every store input (store/core/store_limits.h); a request names at
// most kMaxStoreKeysPerRequest keys; the rounds kept open are the latest roundsKept.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "ddprun/v1/store.pb.h"
#include "etcd/etcd_client.h"
#include "store/forward/forwarding_sink.h"

namespace ddprun {

class EtcdKeyStore;

struct EtcdForwardingOptions {
  EtcdClientOptions client;
  // The root of ddprun's keys in etcd (--rdzv_conf prefix, "/ddprun"); a round's store is under
  // root + storePrefix(run, round), as the workers' (worker_sdk/remote_store.cc).
  std::string root = "/ddprun";
  // The latest rounds whose stores stay open (a round's connections end with it).
  std::size_t roundsKept = 4;
};

class EtcdForwarding {
 public:
  // Connects lazily (etcd's channel); never throws for an unreachable etcd.
  explicit EtcdForwarding(EtcdForwardingOptions options);
  ~EtcdForwarding();
  EtcdForwarding(const EtcdForwarding&) = delete;
  EtcdForwarding& operator=(const EtcdForwarding&) = delete;

  // Runs one request on its round's keys; get and wait wait up to their own timeout_ms. Errors
  // come back as the response's status, coded as the store's (store_status.h). Thread-safe.
  v1::StoreResponse call(v1::StoreRequest& request, std::chrono::milliseconds timeout);

  // A forwarder whose requests go to etcd through this (which it keeps alive).
  static std::shared_ptr<StoreForwarder> makeForwarder(std::shared_ptr<EtcdForwarding> etcd);

 private:
  std::shared_ptr<EtcdKeyStore> storeOf(const std::string& runId, uint64_t round);

  EtcdForwardingOptions options_;
  std::shared_ptr<EtcdClient> client_;
  std::mutex mutex_;
  std::map<std::pair<std::string, uint64_t>, std::shared_ptr<EtcdKeyStore>> stores_;
};

}  // namespace ddprun
