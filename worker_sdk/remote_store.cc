#include "worker_sdk/remote_store.h"

#include <tuple>

#include "common/error.h"
#include "common/net.h"
#include "common/store_prefix.h"
#include "common/strings.h"
#include "common/token_file.h"
#include "store/client/store_client.h"
#include "worker_sdk/etcd_store.h"
#include "worker_sdk/file_store.h"
#include "worker_sdk/tcp_store.h"

namespace ddp {

namespace {

ddprun::StoreClientOptions clientOptions(const RemoteStoreOptions& o) {
  ddprun::StoreClientOptions c;
  c.address = o.address;
  c.token = o.token;
  c.runId = o.runId;
  c.round = o.round;
  c.timeout = o.timeout;
  c.connectTimeout = o.connectTimeout;
  c.tls = o.tls;
  return c;
}

}  // namespace

RemoteStore::RemoteStore(RemoteStoreOptions options)
    : client_(std::make_unique<ddprun::StoreClient>(clientOptions(options))) {}

RemoteStore::~RemoteStore() = default;

void RemoteStore::set(const std::string& key, const std::string& value) { client_->set(key, value); }

std::string RemoteStore::get(const std::string& key) { return client_->get(key); }

int64_t RemoteStore::add(const std::string& key, int64_t delta) { return client_->add(key, delta); }

std::string RemoteStore::compareSet(const std::string& key, const std::string& expected,
                                    const std::string& desired) {
  return client_->compareSet(key, expected, desired);
}

void RemoteStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  client_->wait(keys, timeout);
}

bool RemoteStore::check(const std::vector<std::string>& keys) { return client_->check(keys); }

bool RemoteStore::deleteKey(const std::string& key) { return client_->deleteKey(key); }

int64_t RemoteStore::numKeys() { return client_->numKeys(); }

std::chrono::milliseconds RemoteStore::timeout() const { return client_->options().timeout; }

RemoteStoreOptions remoteStoreOptions(const Env& env) {
  if (env.storeAddr.empty()) {
    throw ddprun::ConfigError(
        "DDPRUN_STORE_ADDR is not set: the worker SDK needs the job's store, which ddprun provides "
        "(plain torchrun does not)");
  }
  if (env.runId.empty()) {
    throw ddprun::ConfigError("no run id: set DDPRUN_RUN_ID or TORCHELASTIC_RUN_ID (ddprun sets both "
                              "TORCHELASTIC_RUN_ID and DDPRUN_STORE_PREFIX)");
  }
  RemoteStoreOptions o;
  o.address = env.storeAddr;
  o.token = env.token;
  o.runId = env.runId;
  o.round = env.round;
  o.tls = ddprun::TlsClientOptions{env.storeTls, env.storeTlsCaCert, env.storeTlsCert, env.storeTlsKey};
  return o;
}

EtcdStoreOptions etcdStoreOptions(const Env& env) {
  constexpr std::string_view kEtcdScheme = "etcd://";
  if (!ddprun::startsWith(env.storeAddr, kEtcdScheme)) {
    throw ddprun::ConfigError("DDPRUN_STORE_ADDR='" + env.storeAddr + "' is not etcd://HOST:PORT[,HOST:PORT...]");
  }
  if (env.runId.empty()) {
    throw ddprun::ConfigError("no run id: set DDPRUN_RUN_ID or TORCHELASTIC_RUN_ID (ddprun sets both)");
  }
  EtcdStoreOptions o;
  o.client.endpoints = ddprun::parseEtcdEndpoints(env.storeAddr.substr(kEtcdScheme.size()));
  o.client.caCertFile = env.etcdCaCert;
  o.client.certFile = env.etcdCert;
  o.client.keyFile = env.etcdKey;
  o.client.tls = !env.etcdCaCert.empty() || !env.etcdCert.empty();
  if (!env.etcdAuthFile.empty()) {
    std::string line = ddprun::readTokenFile(env.etcdAuthFile, "DDPRUN_ETCD_AUTH_FILE");
    auto colon = line.find(':');
    if (colon == std::string::npos) throw ddprun::ConfigError("DDPRUN_ETCD_AUTH_FILE: expected one line USER:PASSWORD");
    o.client.user = line.substr(0, colon);
    o.client.password = line.substr(colon + 1);
  }
  std::string root = env.etcdPrefix;
  while (!root.empty() && root.back() == '/') root.pop_back();
  o.prefix = root + ddprun::storePrefix(env.runId, env.round);
  // Under ddprun's etcd rendezvous the driver writes the round marker with the round.
  o.fenceByRound = true;
  return o;
}

std::unique_ptr<Store> makeStore(const Env& env, std::chrono::milliseconds timeout) {
  if (ddprun::startsWith(env.storeAddr, "etcd://")) {
    EtcdStoreOptions o = etcdStoreOptions(env);
    o.timeout = timeout;
    return std::make_unique<EtcdStore>(std::move(o));
  }
  // One node whose agent serves torch's store: that store, through torch's protocol; the agent
  // binds the connection to the round, so no prefix is needed (worker_sdk/tcp_store.h).
  constexpr std::string_view kTcpStoreScheme = "tcpstore://";
  if (ddprun::startsWith(env.storeAddr, kTcpStoreScheme)) {
    TcpStoreOptions t;
    const std::string endpoint = env.storeAddr.substr(kTcpStoreScheme.size());
    try {
      std::tie(t.host, t.port) = ddprun::parseEndpoint(endpoint, 0);
    } catch (const std::exception& e) {
      throw ddprun::ConfigError("DDPRUN_STORE_ADDR='" + env.storeAddr + "': " + e.what());
    }
    if (t.host.empty() || t.port <= 0 || t.port > 65535) {
      throw ddprun::ConfigError("DDPRUN_STORE_ADDR='" + env.storeAddr + "' must name a host and a port (tcpstore://host:port)");
    }
    t.timeout = timeout;
    return std::make_unique<TcpStore>(std::move(t));
  }
  // ddprun --standalone without the agent's torch store: a folder per round, already private to the
  // round (no prefix needed).
  constexpr std::string_view kFileScheme = "file://";
  if (ddprun::startsWith(env.storeAddr, kFileScheme)) {
    FileStoreOptions f;
    f.path = env.storeAddr.substr(kFileScheme.size());
    if (f.path.empty() || f.path[0] != '/') {
      throw ddprun::ConfigError("DDPRUN_STORE_ADDR='" + env.storeAddr + "' must name an absolute folder (file:///path)");
    }
    f.timeout = timeout;
    return std::make_unique<FileStore>(std::move(f));
  }
  RemoteStoreOptions o = remoteStoreOptions(env);
  o.timeout = timeout;
  return std::make_unique<RemoteStore>(std::move(o));
}

}  // namespace ddp
