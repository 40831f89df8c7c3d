#include "launcher/rendezvous_setup.h"

#include <netdb.h>

#include <random>
#include <tuple>

#include "common/error.h"
#include "common/ids.h"
#include "common/strings.h"
#include "common/net.h"
#include "launcher/flag_parsing.h"

namespace ddprun {

int parseNodeRank(const std::string& value, int maxNodes) {
  return parseIntFlag("--node_rank", value, IntRange{0, maxNodes - 1});
}

void decideRendezvous(LaunchConfig& cfg, const RendezvousFlags& flags) {
  if (cfg.standalone) {
    // As torchrun: one node, a rendezvous of its own, a fresh id and port.
    cfg.minNodes = cfg.maxNodes = 1;
    cfg.runId = flags.runId.empty() ? flags.freshRunId() : flags.runId;
    if (cfg.localAddr.empty()) cfg.masterAddr = "localhost";
  } else {
    cfg.runId = flags.runId.empty() ? "none" : flags.runId;
  }
  // The rendezvous server's rule (common/ids.h), checked here so that a bad id is exit 2 at once,
  // in every mode: it names log folders and store paths too.
  if (auto problem = idProblem(cfg.runId)) {
    throw ConfigError("--rdzv_id '" + printable(cfg.runId, 64) + "': the run id " + *problem);
  }
  // Addresses are hosts (no port): other nodes may be told to connect to them.
  for (auto [flag, host] : {std::pair{"--local_addr", &cfg.localAddr}, std::pair{"--master_addr", &cfg.masterAddr}}) {
    if (host->empty()) continue;
    if (auto problem = hostProblem(*host)) throw ConfigError(std::string(flag) + " '" + printable(*host, 64) + "' " + *problem);
  }
  cfg.multiNode = !cfg.standalone && (cfg.rdzvBackend != RdzvBackend::kStatic || cfg.maxNodes > 1);
  if (!cfg.multiNode) {
    if (!cfg.localAddr.empty()) cfg.masterAddr = cfg.localAddr;
    return;
  }
  if (cfg.rdzvBackend == RdzvBackend::kEtcd) {
    // A list of etcd members (h1:2379,h2:2379); each is checked when the agent connects.
    if (cfg.rdzvEndpoint.empty()) throw ConfigError("--rdzv_backend=etcd needs --rdzv_endpoint HOST[:PORT][,HOST[:PORT]...]");
    std::tie(cfg.endpointHost, cfg.endpointPort) = parseEndpoint(split(cfg.rdzvEndpoint, ',').front(), 2379);
    return;
  }
  if (cfg.rdzvBackend == RdzvBackend::kGrpc) {
    if (cfg.rdzvEndpoint.empty() && cfg.maxNodes > 1) {
      // torchrun would use localhost:29400 here too, and every node would wait for the others
      // at its own address until the join timeout: refused at once instead.
      throw ConfigError("--rdzv_backend=grpc with more than one node needs --rdzv_endpoint HOST[:PORT]");
    }
    if (cfg.rdzvEndpoint.empty()) cfg.rdzvEndpoint = "localhost";  // one node: torchrun's default, localhost:29400
    std::tie(cfg.endpointHost, cfg.endpointPort) = parseEndpoint(cfg.rdzvEndpoint, kDefaultRendezvousPort);
    return;
  }
  // Static: node 0 hosts the rendezvous at --master_addr:--master_port, group rank = node rank.
  cfg.endpointHost = cfg.masterAddr;
  cfg.endpointPort = cfg.masterPort;
  cfg.isHost = cfg.nodeRank == 0;
  if (cfg.minNodes != cfg.maxNodes) {
    throw ConfigError("--nnodes " + flags.nnodes + ": an elastic range needs --rdzv_backend=grpc (or c10d)");
  }
}

void checkResolvable(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* results = nullptr;
  int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &results);
  if (rc != 0) throw ConfigError("rendezvous host '" + host + "' does not resolve: " + ::gai_strerror(rc));
  ::freeaddrinfo(results);
}

std::string randomRunId() {
  std::random_device rd;
  std::string hex;
  const char* digits = "0123456789abcdef";
  for (int i = 0; i < 32; ++i) {
    unsigned nibble = rd() & 0xf;
    if (i == 12) nibble = 4;                 // version
    if (i == 16) nibble = 8 | (nibble & 3);  // RFC 4122 variant
    hex += digits[nibble];
    if (i == 7 || i == 11 || i == 15 || i == 19) hex += '-';
  }
  return hex;
}

}  // namespace ddprun
