#include "launcher/rendezvous_setup.h"

#include <catch2/catch.hpp>
#include <optional>
#include <regex>
#include <string>

#include "common/error.h"

using ddprun::ConfigError;
using ddprun::decideRendezvous;
using ddprun::LaunchConfig;
using ddprun::RendezvousFlags;
using Catch::Contains;

namespace {

// Flags with a run id maker that counts its calls.
struct Flags {
  int freshIds = 0;
  RendezvousFlags flags(std::string runId = "", std::string nnodes = "1") {
    auto fresh = [this] { return "fresh-" + std::to_string(++freshIds); };
    return RendezvousFlags{std::move(runId), std::move(nnodes), fresh};
  }
};

LaunchConfig nodes(int min, int max, int nodeRank = 0) {
  LaunchConfig cfg;
  cfg.minNodes = min;
  cfg.maxNodes = max;
  cfg.nodeRank = nodeRank;
  return cfg;
}

}  // namespace

TEST_CASE("parseNodeRank: from 0 to the largest node count less one", "[cli][rendezvous_setup]") {
  CHECK(ddprun::parseNodeRank("0", 1) == 0);
  CHECK(ddprun::parseNodeRank("3", 4) == 3);
  CHECK_THROWS_WITH(ddprun::parseNodeRank("4", 4), "--node_rank '4': expected an integer from 0 to 3");
  CHECK_THROWS_WITH(ddprun::parseNodeRank("1", 1), Contains("from 0 to 0"));
  CHECK_THROWS_AS(ddprun::parseNodeRank("-1", 4), ConfigError);
}

TEST_CASE("one node without --standalone: run id none, MASTER_ADDR as given", "[cli][rendezvous_setup]") {
  Flags f;
  LaunchConfig cfg;
  decideRendezvous(cfg, f.flags());
  CHECK_FALSE(cfg.multiNode);
  CHECK(cfg.runId == "none");
  CHECK(cfg.masterAddr == "127.0.0.1");
  CHECK(f.freshIds == 0);

  LaunchConfig named;
  decideRendezvous(named, f.flags("job7"));
  CHECK(named.runId == "job7");
}

TEST_CASE("one node: --local_addr becomes MASTER_ADDR", "[cli][rendezvous_setup]") {
  Flags f;
  LaunchConfig cfg;
  cfg.masterAddr = "10.0.0.6";
  cfg.localAddr = "10.0.0.5";
  decideRendezvous(cfg, f.flags());
  CHECK(cfg.masterAddr == "10.0.0.5");
}

TEST_CASE("standalone: one node, a fresh run id, MASTER_ADDR localhost", "[cli][rendezvous_setup]") {
  Flags f;
  LaunchConfig cfg = nodes(2, 4);
  cfg.standalone = true;
  cfg.rdzvBackend = ddprun::RdzvBackend::kGrpc;  // a standalone job has a rendezvous of its own
  decideRendezvous(cfg, f.flags("", "2:4"));
  CHECK(cfg.minNodes == 1);
  CHECK(cfg.maxNodes == 1);
  CHECK_FALSE(cfg.multiNode);
  CHECK(cfg.runId == "fresh-1");
  CHECK(cfg.masterAddr == "localhost");

  LaunchConfig named;
  named.standalone = true;
  named.localAddr = "10.0.0.5";
  decideRendezvous(named, f.flags("job42"));
  CHECK(named.runId == "job42");
  CHECK(f.freshIds == 1);  // a given id needs no fresh one
  CHECK(named.masterAddr == "10.0.0.5");
}

TEST_CASE("grpc: needs an endpoint for several nodes, port 29400 unless given", "[cli][rendezvous_setup]") {
  Flags f;
  LaunchConfig one;
  one.rdzvBackend = ddprun::RdzvBackend::kGrpc;
  decideRendezvous(one, f.flags());  // one node: torchrun's localhost:29400
  CHECK(one.endpointHost == "localhost");
  CHECK(one.endpointPort == 29400);

  LaunchConfig cfg;
  cfg.rdzvBackend = ddprun::RdzvBackend::kGrpc;
  cfg.maxNodes = 2;
  CHECK_THROWS_WITH(decideRendezvous(cfg, f.flags()),
                    "--rdzv_backend=grpc with more than one node needs --rdzv_endpoint HOST[:PORT]");

  cfg.rdzvEndpoint = "node0.example";
  decideRendezvous(cfg, f.flags());
  CHECK(cfg.multiNode);
  CHECK(cfg.endpointHost == "node0.example");
  CHECK(cfg.endpointPort == 29400);
  CHECK_FALSE(cfg.isHost.has_value());  // decided later, by whether the endpoint is local

  LaunchConfig elastic = nodes(1, 4);
  elastic.rdzvBackend = ddprun::RdzvBackend::kGrpc;
  elastic.rdzvEndpoint = "[::1]:29401";
  elastic.isHost = true;  // from --rdzv_conf is_host
  decideRendezvous(elastic, f.flags("", "1:4"));
  CHECK(elastic.endpointHost == "::1");
  CHECK(elastic.endpointPort == 29401);
  CHECK(elastic.isHost == std::optional<bool>(true));
}

TEST_CASE("static multi-node: node 0 hosts at MASTER_ADDR:MASTER_PORT", "[cli][rendezvous_setup]") {
  Flags f;
  LaunchConfig node0 = nodes(2, 2, 0);
  node0.masterAddr = "10.0.0.1";
  node0.masterPort = 29555;
  node0.isHost = false;  // --rdzv_conf is_host does not apply to a static rendezvous
  decideRendezvous(node0, f.flags("", "2"));
  CHECK(node0.multiNode);
  CHECK(node0.endpointHost == "10.0.0.1");
  CHECK(node0.endpointPort == 29555);
  CHECK(node0.isHost == std::optional<bool>(true));

  LaunchConfig node1 = nodes(2, 2, 1);
  node1.localAddr = "10.0.0.2";
  decideRendezvous(node1, f.flags("", "2"));
  CHECK(node1.isHost == std::optional<bool>(false));
  CHECK(node1.masterAddr == "127.0.0.1");  // MASTER_ADDR comes from the rendezvous
}

TEST_CASE("static multi-node: an elastic range needs grpc", "[cli][rendezvous_setup]") {
  Flags f;
  LaunchConfig cfg = nodes(1, 2);
  CHECK_THROWS_WITH(decideRendezvous(cfg, f.flags("", "1:2")),
                    "--nnodes 1:2: an elastic range needs --rdzv_backend=grpc (or c10d)");
}

TEST_CASE("checkResolvable accepts an address and names a host that does not resolve", "[cli][rendezvous_setup]") {
  CHECK_NOTHROW(ddprun::checkResolvable("127.0.0.1"));
  CHECK_NOTHROW(ddprun::checkResolvable("::1"));
  // A label longer than 63 bytes is refused before any query leaves this machine.
  std::string bad(70, 'x');
  CHECK_THROWS_WITH(ddprun::checkResolvable(bad), Contains("rendezvous host '" + bad + "' does not resolve"));
}

TEST_CASE("randomRunId is a fresh version-4 UUID", "[cli][rendezvous_setup]") {
  const std::regex uuid("[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}");
  std::string first = ddprun::randomRunId();
  std::string second = ddprun::randomRunId();
  CHECK(std::regex_match(first, uuid));
  CHECK(std::regex_match(second, uuid));
  CHECK(first != second);
}

TEST_CASE("a run id outside the rendezvous' charset is a configuration error in every mode", "[cli][rendezvous_setup]") {
  for (bool standalone : {true, false}) {
    ddprun::LaunchConfig cfg;
    cfg.standalone = standalone;
    for (const char* bad : {"my job", "a/b", "x\ny"}) {
      INFO(bad);
      CHECK_THROWS_WITH(ddprun::decideRendezvous(cfg, ddprun::RendezvousFlags{bad, "1", [] { return std::string("f"); }}),
                        Catch::Contains("--rdzv_id") && Catch::Contains("may hold only"));
    }
    CHECK_NOTHROW(ddprun::decideRendezvous(cfg, ddprun::RendezvousFlags{"job_42.a-b", "1", [] { return std::string("f"); }}));
  }
}

TEST_CASE("addresses: --local_addr and --master_addr are hosts, a port or garbage is a configuration error", "[cli][rendezvous_setup]") {
  for (const char* bad : {"127.0.0.1:-1", "127.0.0.1:80", "host name", "a..b"}) {
    INFO(bad);
    ddprun::LaunchConfig local;
    local.localAddr = bad;
    CHECK_THROWS_WITH(ddprun::decideRendezvous(local, ddprun::RendezvousFlags{"", "1", [] { return std::string("f"); }}),
                      Catch::Contains("--local_addr"));
    ddprun::LaunchConfig master;
    master.masterAddr = bad;
    CHECK_THROWS_WITH(ddprun::decideRendezvous(master, ddprun::RendezvousFlags{"", "1", [] { return std::string("f"); }}),
                      Catch::Contains("--master_addr"));
  }
  ddprun::LaunchConfig good;
  good.localAddr = "node-3.cluster";
  good.masterAddr = "::1";
  CHECK_NOTHROW(ddprun::decideRendezvous(good, ddprun::RendezvousFlags{"", "1", [] { return std::string("f"); }}));
}

TEST_CASE("etcd: multi-node even for one node, needs an endpoint list, port 2379 unless given", "[cli][rendezvous_setup]") {
  Flags f;
  LaunchConfig none;
  none.rdzvBackend = ddprun::RdzvBackend::kEtcd;
  CHECK_THROWS_WITH(decideRendezvous(none, f.flags()),
                    "--rdzv_backend=etcd needs --rdzv_endpoint HOST[:PORT][,HOST[:PORT]...]");
  LaunchConfig cfg = nodes(2, 4);
  cfg.rdzvBackend = ddprun::RdzvBackend::kEtcd;
  cfg.rdzvEndpoint = "h1,h2:2380,h3:2379";
  decideRendezvous(cfg, f.flags("job42", "2:4"));
  CHECK(cfg.multiNode);
  CHECK(cfg.runId == "job42");
  CHECK(cfg.endpointHost == "h1");  // resolved at once, so that a typo fails with exit 2
  CHECK(cfg.endpointPort == 2379);
}
