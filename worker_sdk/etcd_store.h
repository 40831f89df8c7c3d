// The job's store on etcd (DDPRUN_STORE_ADDR=etcd://h1:2379,h2:2379, the etcd rendezvous backend;
// docs/etcd.md): a Store over ddprun::EtcdClient, every key under the job's round prefix, so a
// restarted group never reads a value of the round before.
//   - wait()/get() read once, then watch the prefix from the revision of that read (no polling,
//     nothing missed between the read and the watch); the watch moves to another member if its
//     member dies.
//   - add() and compareSet() are transactions comparing the key's mod revision (or its value).
//     add() also writes a nonce key (on a short lease) in the same transaction, so that a
//     transaction retried after a lost answer is recognised as already applied: sums stay exact.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "etcd/etcd_client.h"
#include "worker_sdk/store.h"

namespace ddp {

struct EtcdStoreOptions {
  ddprun::EtcdClientOptions client;
  // Every key of this store lives under it ("/ddprun/run/<id>/round/<n>/"); user keys under
  // prefix + "kv/", add()'s nonces under prefix + "op/".
  std::string prefix;
  std::chrono::milliseconds timeout = Store::kDefaultTimeout;  // get() and wait()
  // Fencing by round (docs/etcd.md): when set, the key whose existence means "this round is
  // current" (prefix + "alive", written by the rendezvous driver with the round's assignment and
  // deleted with the round's keys when the next round starts). set/add/compareSet are refused
  // and pending waits fail at once with StateError("stale round") when it is gone; keys are
  // written on the marker's lease (the job's), so they expire if every agent dies.
  bool fenceByRound = false;
};

class EtcdStore final : public Store {
 public:
  explicit EtcdStore(EtcdStoreOptions options);
  ~EtcdStore() override;
  EtcdStore(const EtcdStore&) = delete;
  EtcdStore& operator=(const EtcdStore&) = delete;

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compareSet(const std::string& key, const std::string& expected,
                         const std::string& desired) override;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool deleteKey(const std::string& key) override;
  int64_t numKeys() override;
  std::chrono::milliseconds timeout() const override { return options_.timeout; }

 private:
  std::string dataKey(const std::string& key) const;
  // Values of the keys that exist now (empty string for missing ones, and `present` says which),
  // all read at one revision, returned.
  int64_t readAll(const std::vector<std::string>& keys, std::vector<bool>* present,
                  std::vector<std::string>* values);
  int64_t nonceLease();
  // Adds "the round marker exists" to a transaction's comparisons (fenceByRound).
  void guard(etcdserverpb::TxnRequest& t) const;
  [[noreturn]] void throwStale() const;
  [[noreturn]] void throwTimeout(const std::set<std::string>& missing, std::chrono::milliseconds timeout) const;
  bool roundIsCurrent();
  // The lease of the round marker (the job's lease), 0 without fenceByRound.
  int64_t keyLease();

  EtcdStoreOptions options_;
  std::string dataPrefix_;
  std::string opPrefix_;
  std::string marker_;
  ddprun::EtcdClient client_;
  std::mutex leaseMutex_;
  int64_t lease_ = 0;
  std::chrono::steady_clock::time_point leaseGranted_;
  uint64_t nonceSeq_ = 0;
  int64_t roundLease_ = 0;
  bool roundLeaseKnown_ = false;
  std::string clientId_;
};

}  // namespace ddp
