// The job's store on etcd for libddp's workers (DDPRUN_STORE_ADDR=etcd://h1:2379,h2:2379, the etcd
// rendezvous backend; docs/etcd.md): the Store interface over store/etcd/etcd_key_store.h, whose
// keys, fencing and retries the agent's TCPStore uses too, so torch's ranks and libddp's share them.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "store/etcd/etcd_key_store.h"
#include "worker_sdk/store.h"

namespace ddp {

// A struct of its own: remote_store.h, a public header, declares it without store/etcd.
struct EtcdStoreOptions : ddprun::EtcdKeyStoreOptions {};

class EtcdStore final : public Store {
 public:
  explicit EtcdStore(EtcdStoreOptions options) : store_(static_cast<ddprun::EtcdKeyStoreOptions&&>(options)) {}

  void set(const std::string& key, const std::string& value) override { store_.set(key, value); }
  std::string get(const std::string& key) override { return store_.get(key); }
  int64_t add(const std::string& key, int64_t delta) override { return store_.add(key, delta); }
  std::string compareSet(const std::string& key, const std::string& expected,
                         const std::string& desired) override {
    return store_.compareSet(key, expected, desired);
  }
  using Store::wait;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    store_.wait(keys, timeout);
  }
  bool check(const std::vector<std::string>& keys) override { return store_.check(keys); }
  bool deleteKey(const std::string& key) override { return store_.deleteKey(key); }
  int64_t numKeys() override { return store_.numKeys(); }
  std::chrono::milliseconds timeout() const override { return store_.timeout(); }

 private:
  ddprun::EtcdKeyStore store_;
};

}  // namespace ddp
