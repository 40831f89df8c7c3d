#include "launcher/backend/backend.h"

#include <spdlog/spdlog.h>

#include "common/build_info.h"
#include "common/error.h"
#include "common/net.h"
#include "common/token_file.h"
#include "rendezvous/client/grpc_rendezvous.h"
#include "rendezvous/server/rendezvous_server.h"
#include "store/forward/address_forwarding.h"

namespace ddprun {
namespace {

std::string readToken(const LaunchConfig& cfg) {
  if (!cfg.tokenFile.empty()) return readTokenFile(cfg.tokenFile, "--rdzv_conf token_file");
  const char* env = std::getenv("DDPRUN_RDZV_TOKEN");
  return env ? env : "";
}

class HostedServer final : public HostedRendezvous {
 public:
  explicit HostedServer(RendezvousServerOptions options) : server_(std::move(options)) {}
  void shutdown(std::chrono::milliseconds grace) override { server_.shutdown(grace); }
  RendezvousServer& server() { return server_; }

 private:
  RendezvousServer server_;
};

}  // namespace

MultiNodeRendezvous startGrpc(const LaunchConfig& cfg, PostFn post, FenceFn fence) {
  backend_detail::GrpcPlacement placement;
  placement.host = cfg.isHost;
  placement.address = cfg.localAddr;
  return backend_detail::startGrpcClient(cfg, placement, std::move(post), std::move(fence));
}

namespace backend_detail {

// This node hosts the server when asked (static node 0, is_host=1), or, when unsaid, when the
// endpoint is a free address of this machine (as torchrun's c10d does).
MultiNodeRendezvous startGrpcClient(const LaunchConfig& cfg, const GrpcPlacement& placement, PostFn post,
                                    FenceFn fence) {
  MultiNodeRendezvous out;
  std::string token = readToken(cfg);
  RendezvousServerOptions serverOptions;
  serverOptions.bindAddress = cfg.endpointHost;
  serverOptions.port = cfg.endpointPort;
  serverOptions.token = token;
  serverOptions.guard = guardFromEnvironment();
  serverOptions.serverName = "agent-hosted, ddprun " + std::string(ddprunVersion());
  // Over TLS an agent hosts only with a server certificate (server_cert, server_key); with a
  // certificate of its own (cert) it asks the others for one signed by cacert (mTLS).
  bool canHost = true;
  if (cfg.tls) {
    if (cfg.tlsServerCert.empty()) {
      if (placement.host.value_or(false)) {
        throw ConfigError("--rdzv_conf protocol=https: this node hosts the rendezvous (is_host=1, or static node 0) "
                          "and needs server_cert and server_key");
      }
      canHost = false;
    } else {
      TlsServerOptions tls;
      tls.certFile = cfg.tlsServerCert;
      tls.keyFile = cfg.tlsServerKey;
      if (!cfg.tlsCert.empty()) tls.clientCaFile = cfg.tlsCaCert;
      serverOptions.tls = std::make_shared<TlsServerContext>(tls);
    }
  }
  std::unique_ptr<HostedServer> server;
  if (!canHost) {
    // a client only
  } else if (placement.host.value_or(false)) {
    server = std::make_unique<HostedServer>(serverOptions);
  } else if (!placement.host.has_value()) {
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
    // The supervisor gives workers the limit they had.
    raiseOpenFileLimitForServing(serverOptions.reserveFds, serverOptions.guard != RendezvousServerOptions::Guard::kOff);
  }

  GrpcRendezvousOptions o;
  o.endpoint = joinHostPort(cfg.endpointHost, hosted ? hosted->server().port() : cfg.endpointPort);
  o.token = token;
  o.runId = cfg.runId;
  o.nodeId = newNodeId();
  out.nodeId = o.nodeId;
  o.localWorldSize = cfg.nprocPerNode;
  o.rules = rulesOf(cfg);
  o.host = placement.address;
  o.masterPort = findFreePort("");
  o.nodeRank = placement.nodeRank;
  o.connectTimeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.joinTimeoutSeconds * 1000));
  o.onFenceDeadline = std::move(fence);
  if (cfg.tls) {
    o.tls = TlsClientOptions{true, cfg.tlsCaCert, cfg.tlsCert, cfg.tlsKey};
    // The workers' store is on the same server: the same files, by path (never their contents).
    out.workerEnv.emplace_back("DDPRUN_STORE_TLS", "1");
    if (!cfg.tlsCaCert.empty()) out.workerEnv.emplace_back("DDPRUN_STORE_TLS_CACERT", cfg.tlsCaCert);
    if (!cfg.tlsCert.empty()) out.workerEnv.emplace_back("DDPRUN_STORE_TLS_CERT", cfg.tlsCert);
    if (!cfg.tlsKey.empty()) out.workerEnv.emplace_back("DDPRUN_STORE_TLS_KEY", cfg.tlsKey);
  }
  // torch's store on this node forwards to the job's store (the rendezvous server's), with the
  // job token and the same TLS, over one connection made at the first round.
  StoreClientOptions store;
  store.token = token;
  store.tls = o.tls;
  out.torchStoreSinks = [sinks = forwardingByAddress(std::move(store))](const RoundInfo& round) {
    return sinks(round.storeAddr);
  };
  out.client = makeGrpcRendezvous(std::move(o), std::move(post));
  return out;
}

}  // namespace backend_detail
}  // namespace ddprun
