#include "launcher/backend/backend.h"

#include "common/error.h"
#include "common/net.h"
#include "common/token_file.h"
#include "rendezvous/etcd/etcd_rendezvous.h"
#include "store/forward/etcd_forwarding.h"

namespace ddprun {

MultiNodeRendezvous startEtcd(const LaunchConfig& cfg, PostFn post, FenceFn fence) {
  EtcdRendezvousOptions o;
  o.client.endpoints = parseEtcdEndpoints(cfg.rdzvEndpoint);
  o.client.tls = cfg.tls;
  o.client.caCertFile = cfg.tlsCaCert;
  o.client.certFile = cfg.tlsCert;
  o.client.keyFile = cfg.tlsKey;
  if (!cfg.etcdAuthFile.empty()) {
    std::string line = readTokenFile(cfg.etcdAuthFile, "--rdzv_conf auth_file");
    auto colon = line.find(':');
    if (colon == std::string::npos) throw ConfigError("--rdzv_conf auth_file: expected one line USER:PASSWORD");
    o.client.user = line.substr(0, colon);
    o.client.password = line.substr(colon + 1);
  }
  // A call waits for a new etcd leader (an election takes about a second) well within the
  // heartbeat timeout, after which the node would be declared dead anyway.
  o.client.callTimeout = std::chrono::milliseconds(std::max<int64_t>(500, static_cast<int64_t>(cfg.heartbeatTimeoutSeconds * 250)));
  o.client.retryTimeout = std::chrono::milliseconds(static_cast<int64_t>(std::max(cfg.heartbeatTimeoutSeconds, 5.0) * 1000));
  o.prefix = cfg.etcdPrefix;
  o.runId = cfg.runId;
  o.nodeId = backend_detail::newNodeId();
  o.localWorldSize = cfg.nprocPerNode;
  o.rules = backend_detail::rulesOf(cfg);
  // etcd cannot tell us the address we connect from: the node's own name, as torch's etcd backend.
  o.host = !cfg.localAddr.empty() ? cfg.localAddr : hostName();
  o.masterPort = findFreePort("");
  o.onFenceDeadline = std::move(fence);
  // torch's store on this node runs its requests on the workers' keys in etcd (below), with the
  // agent's etcd login and TLS: no node hosts it, so losing any node loses none of it.
  EtcdForwardingOptions f;
  f.client = o.client;
  f.root = cfg.etcdPrefix;
  auto forwarder = EtcdForwarding::makeForwarder(std::make_shared<EtcdForwarding>(std::move(f)));
  MultiNodeRendezvous out;
  out.nodeId = o.nodeId;
  out.client = makeEtcdRendezvous(std::move(o), std::move(post));
  // The workers' store is on etcd too (worker_sdk/env.h): its key root, TLS files and login, in
  // the environment the agent gives them, not in ddprun's own.
  out.workerEnv.emplace_back("DDPRUN_ETCD_PREFIX", cfg.etcdPrefix);
  if (cfg.tls) {
    out.workerEnv.emplace_back("DDPRUN_ETCD_CACERT", cfg.tlsCaCert);
    if (!cfg.tlsCert.empty()) out.workerEnv.emplace_back("DDPRUN_ETCD_CERT", cfg.tlsCert);
    if (!cfg.tlsKey.empty()) out.workerEnv.emplace_back("DDPRUN_ETCD_KEY", cfg.tlsKey);
  }
  if (!cfg.etcdAuthFile.empty()) out.workerEnv.emplace_back("DDPRUN_ETCD_AUTH_FILE", cfg.etcdAuthFile);
  out.torchStoreSinks = [forwarder](const RoundInfo&) { return forwarder->factory(); };
  return out;
}

}  // namespace ddprun
