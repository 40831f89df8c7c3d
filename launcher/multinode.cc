#include "launcher/multinode.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <random>

#include "common/error.h"
#include "common/net.h"
#include "common/strings.h"
#include "common/token_file.h"
#include "rendezvous/grpc_runtime.h"
#include "rendezvous/etcd_rendezvous.h"
#include "rendezvous/grpc_rendezvous.h"
#include "rendezvous/rendezvous_server.h"

namespace ddprun {
namespace {

std::string readToken(const LaunchConfig& cfg) {
  if (!cfg.tokenFile.empty()) return readTokenFile(cfg.tokenFile, "--rdzv_conf token_file");
  const char* env = std::getenv("DDPRUN_RDZV_TOKEN");
  return env ? env : "";
}

Micros seconds(double s) { return Micros(static_cast<int64_t>(s * 1e6)); }

// The job's rules as this node asks for them, the same for every backend.
RendezvousRules rulesOf(const LaunchConfig& cfg) {
  RendezvousRules rules;
  rules.minNodes = cfg.minNodes;
  rules.maxNodes = cfg.maxNodes;
  rules.maxRestarts = cfg.maxRestarts;
  rules.joinTimeout = seconds(cfg.joinTimeoutSeconds);
  rules.lastCallTimeout = seconds(cfg.lastCallTimeoutSeconds);
  rules.heartbeatTimeout = seconds(cfg.heartbeatTimeoutSeconds);
  return rules;
}

class HostedServer final : public HostedRendezvous {
 public:
  explicit HostedServer(RendezvousServerOptions options) : server_(std::move(options)) {}
  void shutdown(std::chrono::milliseconds grace) override { server_.shutdown(grace); }
  RendezvousServer& server() { return server_; }

 private:
  RendezvousServer server_;
};

std::string newNodeId() {
  return hostName() + ":" + std::to_string(::getpid()) + ":" + std::to_string(std::random_device{}() % 100000);
}

// --rdzv_backend=etcd: no server of ours; the agents meet in etcd (docs/etcd.md).
MultiNodeRendezvous startEtcd(const LaunchConfig& cfg, PostFn post, FenceFn fence) {
  EtcdRendezvousOptions o;
  o.client.endpoints = parseEtcdEndpoints(cfg.rdzvEndpoint);
  o.client.tls = cfg.etcdTls;
  o.client.caCertFile = cfg.etcdCaCert;
  o.client.certFile = cfg.etcdCert;
  o.client.keyFile = cfg.etcdKey;
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
  o.nodeId = newNodeId();
  o.localWorldSize = cfg.nprocPerNode;
  o.rules = rulesOf(cfg);
  // etcd cannot tell us the address we connect from: the node's own name, as torch's etcd backend.
  o.host = !cfg.localAddr.empty() ? cfg.localAddr : hostName();
  o.masterPort = findFreePort("");
  o.onFenceDeadline = std::move(fence);
  // The workers' store is on etcd too: launch.cc gives them its key root and TLS files.
  MultiNodeRendezvous out;
  out.client = std::make_unique<EtcdRendezvous>(o, std::move(post));
  return out;
}

}  // namespace

// This node hosts the server when asked (static node 0, is_host=1), or, when unsaid, when the
// endpoint is a free address of this machine (as torchrun's c10d does).
MultiNodeRendezvous startMultiNode(const LaunchConfig& cfg, PostFn post, FenceFn fence) {
  prepareGrpcRuntime();
  if (cfg.rdzvBackend == "etcd") return startEtcd(cfg, std::move(post), std::move(fence));
  MultiNodeRendezvous out;
  std::string token = readToken(cfg);
  RendezvousServerOptions serverOptions;
  serverOptions.bindAddress = cfg.endpointHost;
  serverOptions.port = cfg.endpointPort;
  serverOptions.token = token;
  serverOptions.guard = guardFromEnvironment();
  std::unique_ptr<HostedServer> server;
  if (cfg.isHost.value_or(false)) {
    server = std::make_unique<HostedServer>(serverOptions);
  } else if (!cfg.isHost.has_value()) {
    try {
      server = std::make_unique<HostedServer>(serverOptions);
    } catch (const ConnectionError& e) {
      spdlog::debug("not hosting the rendezvous ({}); joining {} as a client", e.what(), cfg.rdzvEndpoint);
    }
  }
  HostedServer* hosted = server.get();
  out.server = std::move(server);
  if (hosted) {
    spdlog::info("hosting the rendezvous at {}", hosted->server().address());
    raiseOpenFileLimitForServing();  // the supervisor gives workers the limit they had
  }

  GrpcRendezvousOptions o;
  o.endpoint = joinHostPort(cfg.endpointHost, hosted ? hosted->server().port() : cfg.endpointPort);
  o.token = token;
  o.runId = cfg.runId;
  o.nodeId = newNodeId();
  o.localWorldSize = cfg.nprocPerNode;
  o.rules = rulesOf(cfg);
  bool staticMode = cfg.rdzvBackend == "static";
  o.host = !cfg.localAddr.empty() ? cfg.localAddr : (staticMode && cfg.nodeRank == 0 ? cfg.masterAddr : "");
  o.masterPort = findFreePort("");
  o.nodeRank = staticMode ? cfg.nodeRank : -1;
  o.connectTimeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.joinTimeoutSeconds * 1000));
  o.onFenceDeadline = std::move(fence);
  out.client = std::make_unique<GrpcRendezvous>(o, std::move(post));
  return out;
}

}  // namespace ddprun
