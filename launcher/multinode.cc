#include "launcher/multinode.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <random>

#include "common/error.h"
#include "common/net.h"
#include "common/strings.h"
#include "common/token_file.h"
#include "rendezvous/grpc_runtime.h"
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

class HostedServer final : public HostedRendezvous {
 public:
  explicit HostedServer(RendezvousServerOptions options) : server_(std::move(options)) {}
  void shutdown(std::chrono::milliseconds grace) override { server_.shutdown(grace); }
  RendezvousServer& server() { return server_; }

 private:
  RendezvousServer server_;
};

}  // namespace

// This node hosts the server when asked (static node 0, is_host=1), or, when unsaid, when the
// endpoint is a free address of this machine (as torchrun's c10d does).
MultiNodeRendezvous startMultiNode(const LaunchConfig& cfg, PostFn post, FenceFn fence) {
  prepareGrpcRuntime();
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
  o.nodeId = hostName() + ":" + std::to_string(::getpid()) + ":" + std::to_string(std::random_device{}() % 100000);
  o.localWorldSize = cfg.nprocPerNode;
  o.rules.minNodes = cfg.minNodes;
  o.rules.maxNodes = cfg.maxNodes;
  o.rules.maxRestarts = cfg.maxRestarts;
  o.rules.joinTimeout = seconds(cfg.joinTimeoutSeconds);
  o.rules.lastCallTimeout = seconds(cfg.lastCallTimeoutSeconds);
  o.rules.heartbeatTimeout = seconds(cfg.heartbeatTimeoutSeconds);
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
