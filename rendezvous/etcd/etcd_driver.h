// The driver of the etcd backend (etcd_rendezvous.h): the one node the election chose runs the
// job's one RulesHost, fed by the keys under <job>/rdzv/ (node keys: joins and leaves; events: the
// agents' reports) and ticked on this process's monotonic clock. Every batch of notices goes out
// in one transaction that holds only while the driver key is still this node's, together with the
// state's snapshot (a successor goes on from it), the applied events' deletion and the workers'
// store round marker.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "etcd/etcd_client.h"
#include "etcd/etcd_watch.h"
#include "rendezvous/etcd/etcd_keys.h"
#include "rendezvous/rules/rules_host.h"

namespace ddprun {

struct EtcdDriverOptions {
  std::string runId;
  std::string nodeId;     // this node: the driver key holds it
  RendezvousRules rules;  // for a job with no snapshot yet
  std::string root;       // the key root (EtcdKeys)
  int64_t jobLease = 0;   // the notices, the snapshot and the store's round marker live on it
  std::chrono::milliseconds heartbeat{5000};
};

// The revision a watch from now starts after, once etcd created it; nullopt when `stopping` is set
// first. ConnectionError when no member carried it for the client's retry timeout.
std::optional<int64_t> waitWatchStarted(EtcdWatch& watch, const std::atomic<bool>& stopping);

class EtcdDriver {
 public:
  enum class End { kOver, kWatchLost };

  // `client` and `stopping` must outlive the driver.
  EtcdDriver(EtcdClient& client, EtcdDriverOptions options, const std::atomic<bool>& stopping);

  // Drives until the job closes (kOver), this node is deposed (kOver), `stopping` is set (kOver),
  // or its watch is lost (kWatchLost: the caller hands the driver key over). Throws Error when
  // etcd refused or did not answer a write.
  End drive();

 private:
  // A batch that only changed the state waits this long for one that must go out (drive()).
  static constexpr std::chrono::milliseconds kSnapshotDelay{200};
  static constexpr std::chrono::milliseconds kStep{100};  // how often a wait checks `stopping`

  // One key under rdzv/ (value null: deleted) into the rules host.
  void apply(RulesHost& host, std::set<std::string>& live, const std::string& key, const std::string* value,
             Effects& out, std::vector<std::string>& applied);
  // Notices, the applied events' deletion, the store's drops and the state's snapshot in one
  // transaction guarded by the driver key; false when this node no longer drives.
  bool write(const RulesHost& host, const Effects& effects, const std::vector<std::string>& applied);

  EtcdClient& client_;
  const EtcdDriverOptions options_;
  const std::atomic<bool>& stopping_;
  const EtcdKeys keys_;
  uint64_t noticeSeq_ = 0;   // the last notice's number; a takeover goes on from the snapshot's
};

}  // namespace ddprun
