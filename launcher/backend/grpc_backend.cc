#include "launcher/backend/backend.h"

#include <spdlog/spdlog.h>

#include "common/build_info.h"
#include "common/error.h"
#include "common/net.h"
#include "common/token_file.h"
#include "rendezvous/client/grpc_rendezvous.h"
#include "rendezvous/server/rendezvous_server.h"

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
  std::unique_ptr<HostedServer> server;
  if (placement.host.value_or(false)) {
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
  out.client = makeGrpcRendezvous(std::move(o), std::move(post));
  return out;
}

}  // namespace backend_detail
}  // namespace ddprun
