// The job's store, served by the rendezvous server (DDPRUN_STORE_ADDR): a Store over
// ddprun::StoreClient. Every key lives under the job's run id and round, so a group restarted into
// a new round never reads a value (an NCCL id, an address) of the round before it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "tls/tls_options.h"
#include "worker_sdk/env.h"
#include "worker_sdk/store.h"

namespace ddprun {
class StoreClient;
}

namespace ddp {

struct RemoteStoreOptions {
  std::string address;  // host:port of the store service
  std::string token;    // the job token; empty when the job has none
  std::string runId;
  uint64_t round = 0;
  std::chrono::milliseconds timeout = Store::kDefaultTimeout;  // get() and wait()
  std::chrono::milliseconds connectTimeout = std::chrono::seconds(30);
  ddprun::TlsClientOptions tls{};  // Env's DDPRUN_STORE_TLS*
};

class RemoteStore final : public Store {
 public:
  // Connects (retrying up to connectTimeout); ConnectionError when the store cannot be reached.
  explicit RemoteStore(RemoteStoreOptions options);
  ~RemoteStore() override;
  RemoteStore(const RemoteStore&) = delete;
  RemoteStore& operator=(const RemoteStore&) = delete;

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
  std::chrono::milliseconds timeout() const override;

 private:
  std::unique_ptr<ddprun::StoreClient> client_;
};

// The options for the job's store as the environment names it. Throws ddprun::ConfigError naming
// DDPRUN_STORE_ADDR when it is unset (ddprun gives every job a store; plain torchrun does not),
// and naming DDPRUN_RUN_ID/TORCHELASTIC_RUN_ID when no run id is known.
RemoteStoreOptions remoteStoreOptions(const Env& env);

// The options for the job's store on etcd (DDPRUN_STORE_ADDR=etcd://h1:2379,h2:2379): keys under
// <DDPRUN_ETCD_PREFIX>/run/<id>/round/<n>/ (the etcd rendezvous' layout, docs/etcd.md).
struct EtcdStoreOptions;
EtcdStoreOptions etcdStoreOptions(const Env& env);

// Connects to the job's store with the given timeout: a TcpStore (torch's protocol to the agent's
// store) when DDPRUN_STORE_ADDR is tcpstore://host:port (one node, the agent serving torch's
// store), a FileStore over the folder when it is file:///path (one node, --torch_store=rank0), an
// EtcdStore when it is etcd://h1:2379,h2:2379 (--rdzv_backend=etcd), else
// RemoteStore(remoteStoreOptions(env)).
std::unique_ptr<Store> makeStore(const Env& env, std::chrono::milliseconds timeout = Store::kDefaultTimeout);

}  // namespace ddp
