#include "rendezvous/server/status_command.h"

#include <fmt/format.h>

#include <boost/json.hpp>
#include <grpcpp/client_context.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>

#include "common/error.h"
#include "common/exit_codes.h"
#include "common/token_file.h"
#include "ddprun/v1/rendezvous.grpc.pb.h"
#include "rendezvous/client/connect_probe.h"
#include "rendezvous/etcd/etcd_status.h"
#include "rpc/grpc_runtime.h"
#include "rpc/grpc_util.h"
#include "tls/client.h"

namespace ddprun {
namespace {

namespace pb = ddprun::v1;

std::string age(double seconds) {
  if (seconds < 60) return fmt::format("{:.1f}s", seconds);
  return fmt::format("{:.0f}m{:02.0f}s", seconds / 60 - 0.5, static_cast<double>(static_cast<long>(seconds) % 60));
}

// Durations as whole milliseconds (Boost.JSON writes doubles as 2.39785E-1); null when unknown.
boost::json::value millis(double seconds) {
  if (seconds < 0) return nullptr;
  return static_cast<int64_t>(std::llround(seconds * 1000));
}

boost::json::object toJson(const pb::JobStatus& job) {
  boost::json::array nodes;
  for (const auto& n : job.nodes()) {
    nodes.push_back(boost::json::object{{"node_id", n.node_id()},
                                        {"host", n.host()},
                                        {"group_rank", n.group_rank()},
                                        {"state", n.state()},
                                        {"last_heartbeat_age_ms", millis(n.last_heartbeat_age_s())},
                                        {"lease_left_ms", millis(n.lease_left_s())}});
  }
  boost::json::value failure = nullptr;
  if (job.has_last_failure()) {
    const auto& f = job.last_failure();
    failure = boost::json::object{{"seq", f.seq()},        {"kind", f.kind()},         {"node", f.node()},
                                  {"round", f.round()},    {"cause", f.cause()},       {"message", f.message()},
                                  {"rank", f.rank()},      {"exit_code", f.exit_code()}, {"signal", f.signal()},
                                  {"age_ms", millis(f.age_s())}};
  }
  return boost::json::object{{"run_id", job.run_id()},
                             {"phase", job.phase()},
                             {"round", job.round()},
                             {"min_nodes", job.min_nodes()},
                             {"max_nodes", job.max_nodes()},
                             {"restarts", job.restarts()},
                             {"max_restarts", job.max_restarts()},
                             {"node_count", job.node_count()},
                             {"members", job.members()},
                             {"agents_connected", job.agents_connected()},
                             {"events", job.events()},
                             {"nodes", std::move(nodes)},
                             {"last_failure", std::move(failure)}};
}

void printTable(const pb::StatusReply& reply) {
  if (reply.jobs().empty()) std::cout << "no jobs (" << reply.server() << ")\n";
  for (const auto& job : reply.jobs()) {
    std::cout << "job " << job.run_id() << ": " << job.phase() << ", round " << job.round() << ", " << job.node_count()
              << " node(s) (" << job.min_nodes() << ".." << job.max_nodes() << "), restarts " << job.restarts()
              << " of " << job.max_restarts() << ", " << job.events() << " event(s)\n";
    if (!job.nodes().empty()) {
      std::printf("  %-40s %-24s %5s  %-9s %s\n", "NODE", "HOST", "RANK", "STATE", "HEARTBEAT");
      std::fflush(stdout);
      for (const auto& n : job.nodes()) {
        std::string heartbeat = n.last_heartbeat_age_s() < 0 ? "-" : age(n.last_heartbeat_age_s()) + " ago";
        if (n.lease_left_s() >= 0) heartbeat += ", lease " + age(n.lease_left_s()) + " left";
        std::printf("  %-40s %-24s %5s  %-9s %s\n", n.node_id().c_str(), n.host().c_str(),
                    n.group_rank() >= 0 ? std::to_string(n.group_rank()).c_str() : "-", n.state().c_str(),
                    heartbeat.c_str());
      }
      std::fflush(stdout);
      if (static_cast<uint32_t>(job.nodes_size()) < job.node_count()) {
        std::cout << "  ... " << job.node_count() - job.nodes_size() << " more (--max_nodes)\n";
      }
    }
    if (job.has_last_failure()) {
      const auto& f = job.last_failure();
      std::cout << "  last failure (" << (f.age_s() >= 0 ? age(f.age_s()) + " ago, " : std::string()) << "event "
                << f.seq() << "): " << f.kind();
      if (!f.node().empty()) std::cout << " on " << f.node();
      if (f.round()) std::cout << ", round " << f.round();
      if (!f.cause().empty()) std::cout << " [" << f.cause() << "]";
      std::cout << ": " << f.message() << "\n";
    }
  }
}

// Whether the server at `endpoint` takes a connection and answers as an HTTP/2 server (over TLS
// when `tls` says so): then a call that failed UNAVAILABLE was closed at its request.
bool closedAtTheRequest(const std::string& endpoint, const TlsClientOptions& tls) {
  if (tls.enabled) return probeTls(endpoint, tls, std::chrono::milliseconds(1000)).connected;
  return probeConnection(endpoint, std::chrono::milliseconds(500)).why.empty();
}

int exitOf(const grpc::Status& status) {
  switch (status.error_code()) {
    case grpc::StatusCode::NOT_FOUND: return 1;
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED:
    case grpc::StatusCode::UNIMPLEMENTED: return kExitUsage;
    default: return kExitInfrastructure;
  }
}

}  // namespace

int statusCommand(const std::vector<std::string>& args) {
  // gRPC's own error lines ("E1129 ... ssl_transport_security.cc ...") go to debug logging: the
  // command says what failed in one line of its own.
  prepareGrpcRuntime();
  CLI::App app{"ddprun-rdzv status: the jobs a rendezvous holds, their nodes and last failure", "ddprun-rdzv status"};
  std::string endpoint, runId, tokenFile, backend = "grpc";
  bool json = false;
  unsigned maxNodes = 0;
  double timeoutSeconds = 10;
  app.add_option("--rdzv_endpoint,--rdzv-endpoint", endpoint,
                 "HOST:PORT of ddprun-rdzv or of the agent that hosts the job; etcd: h1:2379,h2:2379,...")
      ->required();
  app.add_option("--rdzv_id,--rdzv-id", runId, "Only this job (required with etcd)");
  app.add_option("--rdzv_backend,--rdzv-backend", backend, "grpc (ddprun-rdzv or an agent; also c10d, static) or etcd");
  app.add_option("--token_file,--token-file", tokenFile, "File holding the job token (else DDPRUN_RDZV_TOKEN)");
  app.add_flag("--json", json, "One JSON object (README, \"ddprun-rdzv status\")");
  app.add_option("--max_nodes,--max-nodes", maxNodes, "Nodes listed per job (default 1000, at most 10000)");
  app.add_option("--timeout", timeoutSeconds, "Seconds to wait for an answer (default 10)")->check(CLI::Range(0.1, 600.0));
  TlsClientOptions tls;
  app.add_option("--tls_ca,--tls-ca", tls.caCertFile,
                 "TLS (ddprun-rdzv, an agent, or etcd with protocol=https): the CA the server's certificate must chain to");
  app.add_option("--tls_cert,--tls-cert", tls.certFile, "mTLS: this client's certificate");
  app.add_option("--tls_key,--tls-key", tls.keyFile, "mTLS: its private key");
  EtcdStatusOptions etcd;
  app.add_option("--rdzv_prefix,--etcd_prefix", etcd.prefix, "etcd: the key prefix the job uses (default /ddprun)");
  std::vector<const char*> argv{"ddprun-rdzv status"};
  for (const auto& a : args) argv.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), const_cast<char**>(argv.data()));
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "ddprun-rdzv status: error: " << e.what() << "\n";
    return kExitUsage;
  }
  try {
    std::string token;
    if (!tokenFile.empty()) {
      token = readTokenFile(tokenFile, "--token_file");
    } else if (const char* env = std::getenv("DDPRUN_RDZV_TOKEN")) {
      token = env;
    }
    const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeoutSeconds * 1000));
    pb::StatusReply reply;
    if (backend == "etcd" || backend == "etcd-v2") {
      if (runId.empty()) throw ConfigError("--rdzv_id is required with --rdzv_backend=etcd");
      etcd.endpoints = endpoint;
      etcd.runId = runId;
      etcd.timeout = timeout;
      etcd.maxNodes = maxNodes;
      // As the agents' rdzv_conf protocol=https,cacert,cert,key on the etcd backend.
      etcd.client.tls = !tls.caCertFile.empty() || !tls.certFile.empty();
      etcd.client.caCertFile = tls.caCertFile;
      etcd.client.certFile = tls.certFile;
      etcd.client.keyFile = tls.keyFile;
      reply = readEtcdStatus(etcd);
      if (reply.jobs().empty()) {
        std::cerr << "ddprun-rdzv status: error: no job '" << runId << "' in etcd under " << etcd.prefix << "\n";
        return 1;
      }
    } else if (backend == "grpc" || backend == "c10d" || backend == "static") {
      tls.enabled = !tls.caCertFile.empty() || !tls.certFile.empty();
      pb::StatusRequest request;
      request.set_run_id(runId);
      request.set_max_nodes(maxNodes);
      const auto call = [&] {  // on a channel of its own: a retry must not reuse a closed connection
        auto stub = pb::Rendezvous::NewStub(makeChannel(endpoint, std::chrono::milliseconds(0), tls));
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + timeout);
        if (!token.empty()) context.AddMetadata(kTokenMetadataKey, token);
        return stub->Status(&context, request, &reply);
      };
      grpc::Status status = call();
      if (status.error_code() == grpc::StatusCode::UNAVAILABLE && closedAtTheRequest(endpoint, tls)) {
        // The server answers a connection, yet closed the one that carried this call. From an
        // address its guard penalized lately, a request without the job's token is closed before
        // gRPC sees it (no "invalid job token" can be sent back); the guard is not ours to change
        // here, so the command tells it by trying once more.
        status = call();
        if (status.error_code() == grpc::StatusCode::UNAVAILABLE && closedAtTheRequest(endpoint, tls)) {
          std::cerr << "ddprun-rdzv status: error: " << (token.empty() ? "no job token" : "invalid job token")
                    << ": the rendezvous at " << endpoint
                    << " closed the connection at this request, as its guard does to a request without the job's "
                       "token from an address that broke its call limits lately; "
                    << (token.empty() ? "give" : "check") << " --token_file or DDPRUN_RDZV_TOKEN\n";
          return kExitUsage;
        }
      }
      if (!status.ok()) {
        std::string what = status.error_message();
        if (status.error_code() == grpc::StatusCode::UNAVAILABLE || status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
          // A certificate or a TLS-on-one-side mismatch: said as such, exit 2 (a configuration error).
          const TlsProbeResult probe = tls.enabled ? probeTls(endpoint, tls, std::chrono::milliseconds(2000))
                                                   : TlsProbeResult{};
          if (probe.configError) {
            // The probe speaks the agents' --rdzv_conf; this command's flags are --tls_cert, --tls_key.
            std::string why = probe.why;
            if (const auto at = why.find("(give cert= and key=)"); at != std::string::npos)
              why.replace(at, 21, "(give --tls_cert and --tls_key)");
            std::cerr << "ddprun-rdzv status: error: cannot connect to the rendezvous at " << endpoint << ": "
                      << why << "\n";
            return kExitUsage;
          }
          if (!tls.enabled && whyUnreachable(endpoint, std::chrono::milliseconds(500)).find(kTlsRequiredReason) !=
                                  std::string::npos) {
            std::cerr << "ddprun-rdzv status: error: the rendezvous at " << endpoint << " requires TLS: give --tls_ca\n";
            return kExitUsage;
          }
          what = "cannot reach the rendezvous at " + endpoint + ": " + what;
        } else if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
          what = "the rendezvous at " + endpoint + " has no Status call (an older ddprun)";
        }
        std::cerr << "ddprun-rdzv status: error: " << what << "\n";
        return exitOf(status);
      }
    } else {
      throw ConfigError("--rdzv_backend must be grpc, c10d, static or etcd, not '" + backend + "'");
    }
    if (json) {
      boost::json::array jobs;
      for (const auto& job : reply.jobs()) jobs.push_back(toJson(job));
      std::cout << boost::json::serialize(boost::json::object{{"server", reply.server()}, {"jobs", std::move(jobs)}})
                << "\n";
    } else {
      printTable(reply);
    }
    return 0;
  } catch (const ConfigError& e) {
    std::cerr << "ddprun-rdzv status: error: " << e.what() << "\n";
    return kExitUsage;
  } catch (const std::exception& e) {
    std::cerr << "ddprun-rdzv status: error: " << e.what() << "\n";
    return kExitInfrastructure;
  }
}

}  // namespace ddprun
