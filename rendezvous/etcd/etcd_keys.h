// The etcd backend's key layout (docs/etcd.md, "Keys"), in one place. Under a key root (torch's
// rdzv_conf etcd_prefix, "/ddprun" by default) a job owns <root>/run/<id>/ (common/store_prefix.h):
//   rdzv/driver                 the elected driver's node id, on its node lease
//   rdzv/joblease               the job lease's id, on that lease
//   rdzv/state                  the driver's snapshot of the rules' state (etcd_records.h)
//   rdzv/nodes/<node>           a node's Join, on its node lease: its key is its liveness
//   rdzv/events/<node>/<seq>    a node's reports to the driver (AgentMessage)
//   rdzv/notices/<node>/<seq>   the driver's notices to a node (ServerMessage)
//   round/<n>/alive             the round's marker: the workers' store of round n is current
//   round/<n>/...               the workers' store of round n (store/etcd/etcd_key_store.h)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "etcd/etcd_client.h"

namespace ddprun {

class EtcdKeys {
 public:
  // `root` may end in '/' (as a user writes it); the keys do not double it.
  EtcdKeys(std::string_view root, std::string_view runId);

  const std::string& job() const { return job_; }    // every key of the job: the last node out deletes it
  const std::string& rdzv() const { return rdzv_; }  // the rendezvous' keys (the driver watches them)
  std::string driver() const { return rdzv_ + "driver"; }
  std::string jobLease() const { return rdzv_ + "joblease"; }
  std::string state() const { return rdzv_ + "state"; }
  std::string nodes() const { return rdzv_ + "nodes/"; }
  std::string node(std::string_view nodeId) const;
  std::string event(std::string_view nodeId, uint64_t seq) const;
  std::string notices(std::string_view nodeId) const;  // one node's notices (what it watches)
  std::string notice(std::string_view nodeId, uint64_t seq) const;
  std::string rounds() const { return rounds_; }  // the workers' stores of every round
  std::string round(uint64_t round) const;        // round n's store (DDPRUN_ETCD_PREFIX + storePrefix)
  std::string roundMarker(uint64_t round) const;

  // The node a key under nodes() names; nullopt for another key.
  std::optional<std::string> nodeOfNodeKey(std::string_view key) const;
  // The node whose report a key under rdzv/events/ is; nullopt for another key.
  std::optional<std::string> nodeOfEventKey(std::string_view key) const;

 private:
  std::string job_, rdzv_, rounds_;
};

// The key suffix of a node's n-th event or notice: zero-padded, so that etcd's key order is their
// order.
std::string seqKey(uint64_t seq);

// A transaction that holds only while the driver key is `nodeId`'s: the driver's writes and its
// hand-over are guarded by it.
etcdserverpb::TxnRequest whileDriver(const EtcdKeys& keys, const std::string& nodeId);

// Adds to `txn`'s success branch the deletion of every round's store but `keep`'s (rounds only
// grow, so: every round before it), in two ranges around it: round numbers do not sort as
// numbers in etcd's key order.
void dropRoundsBelow(const EtcdKeys& keys, uint64_t keep, etcdserverpb::TxnRequest* txn);
// Adds the deletion of every round's store of the job.
void dropAllRounds(const EtcdKeys& keys, etcdserverpb::TxnRequest* txn);

}  // namespace ddprun
