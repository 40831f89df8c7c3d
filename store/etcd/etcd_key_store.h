// The job's store on etcd (the etcd rendezvous backend; docs/etcd.md): every key under the job's
// round prefix, so a restarted group never reads a value of the round before. One class for every
// client of those keys: libddp's workers (worker_sdk/etcd_store.h, DDPRUN_STORE_ADDR=etcd://...)
// and the agent's loopback TCPStore, which forwards torch's store here (store/forward/
// etcd_forwarding.h), so that a C++ rank and a torch rank of one job read the same keys.
//   - wait()/get() read once, then watch the prefix from the revision of that read (no polling,
//     nothing missed between the read and the watch); the watch moves to another member if its
//     member dies.
//   - add() and compareSet() are transactions comparing the key's mod revision (or its value).
//     add() also writes a nonce key (on a short lease) in the same transaction, so that a
//     transaction retried after a lost answer is recognised as already applied: sums stay exact.
//     append() compares the mod revision the same way (a retried append whose first attempt was
//     applied appends twice: torch's append has the same contract over a lost answer).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "etcd/etcd_client.h"

namespace ddprun {

struct EtcdKeyStoreOptions {
  EtcdClientOptions client;  // unused when the store is given a client
  // Every key of this store lives under it ("/ddprun/run/<id>/round/<n>/"); user keys under
  // prefix + "kv/", add()'s nonces under prefix + "op/".
  std::string prefix;
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};  // get() and wait() without one: torch's default
  // Fencing by round (docs/etcd.md): when set, the key whose existence means "this round is
  // current" (prefix + "alive", written by the rendezvous driver with the round's assignment and
  // deleted with the round's keys when the next round starts). set/add/compareSet are refused
  // and pending waits fail at once with StateError("stale round") when it is gone; keys are
  // written on the marker's lease (the job's), so they expire if every agent dies.
  bool fenceByRound = false;
};

// Errors are common/error.h's: TimeoutError (naming the missing keys), ConnectionError (etcd is
// unreachable), StateError (add() on a value that is not a number, or a stale round),
// ConfigError (an empty key). Thread-safe: calls may run on several threads at once.
class EtcdKeyStore {
 public:
  // A client of its own, made from options.client.
  explicit EtcdKeyStore(EtcdKeyStoreOptions options);
  // A client shared with other stores (the rounds of one job share one connection).
  EtcdKeyStore(EtcdKeyStoreOptions options, std::shared_ptr<EtcdClient> client);
  ~EtcdKeyStore();
  EtcdKeyStore(const EtcdKeyStore&) = delete;
  EtcdKeyStore& operator=(const EtcdKeyStore&) = delete;

  void set(const std::string& key, const std::string& value);
  // Waits up to timeout() (or `timeout`) for the key, then returns its value.
  std::string get(const std::string& key);
  std::string get(const std::string& key, std::chrono::milliseconds timeout);
  int64_t add(const std::string& key, int64_t delta);
  // Sets desired when the key holds expected, or is missing and expected is empty. Returns the
  // value after the call (empty when the key is missing); wasMissing says whether it was.
  std::string compareSet(const std::string& key, const std::string& expected, const std::string& desired,
                         bool* wasMissing = nullptr);
  // Appends value to the key's value (a missing key counts as empty).
  void append(const std::string& key, const std::string& value);
  // The keys' values read at one revision, "" for a missing one; found[i] says which exist.
  std::vector<std::string> multiGet(const std::vector<std::string>& keys, std::vector<bool>* found);
  // Sets every key in one transaction (all or none).
  void multiSet(const std::vector<std::string>& keys, const std::vector<std::string>& values);
  // Every key of the store, by name.
  std::vector<std::string> listKeys();
  void wait(const std::vector<std::string>& keys) { wait(keys, options_.timeout); }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  bool check(const std::vector<std::string>& keys);
  bool deleteKey(const std::string& key);
  int64_t numKeys();
  std::chrono::milliseconds timeout() const { return options_.timeout; }

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

  EtcdKeyStoreOptions options_;
  std::string dataPrefix_;
  std::string opPrefix_;
  std::string marker_;
  std::shared_ptr<EtcdClient> owned_;
  EtcdClient& client_;
  std::mutex leaseMutex_;
  int64_t lease_ = 0;
  std::chrono::steady_clock::time_point leaseGranted_;
  uint64_t nonceSeq_ = 0;
  int64_t roundLease_ = 0;
  bool roundLeaseKnown_ = false;
  std::string clientId_;
};

}  // namespace ddprun
