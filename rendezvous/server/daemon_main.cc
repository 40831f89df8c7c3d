// ddprun-rdzv: the standalone rendezvous daemon. Serves many jobs (by run id) and keeps running
// between them, so that a job does not depend on the agent that would otherwise host it.
#include <signal.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <iostream>

#include "common/build_info.h"
#include "common/error.h"
#include "common/logging.h"
#include "common/strings.h"
#include "common/token_file.h"
#include "rendezvous/server/status_command.h"
#include "rendezvous/server/rendezvous_server.h"
#include "rpc/grpc_runtime.h"

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "status") {
    return ddprun::statusCommand(std::vector<std::string>(argv + 2, argv + argc));
  }
  CLI::App app{"ddprun-rdzv: the standalone rendezvous and store server for ddprun jobs", "ddprun-rdzv"};
  app.set_version_flag("--version", [] {
    auto links = ddprun::grpcLinks(DDPRUN_GRPC_COMPILED_IN);
    for (auto& link : ddprun::loggingLinks()) links.push_back(link);
    links.push_back(ddprun::cxxRuntimeLink());
    return ddprun::versionText("ddprun-rdzv", links);
  });
  int port = 29400;
  std::string bind = "127.0.0.1";
  std::string tokenFile;
  std::string logLevel = "info";
  app.add_option("--port", port, "Port to listen on (0: any free port, printed at start)")->check(CLI::Range(0, 65535));
  app.add_option("--bind", bind, "Address to listen on; 0.0.0.0 or :: listens on every interface");
  app.add_option("--token_file,--token-file", tokenFile, "File holding the job token (else DDPRUN_RDZV_TOKEN)");
  app.add_option("--log_level,--log-level", logLevel, "debug, info, warning, error");
  ddprun::RendezvousServerOptions options;
  ddprun::RunScopedStoreOptions& limits = options.storeLimits;
  app.add_option("--store_run_bytes,--store-run-bytes", limits.maxBytesPerRun,
                 "Store bytes (keys + values) one job may hold (default 256 MiB)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 40));
  app.add_option("--store_run_keys,--store-run-keys", limits.maxKeysPerRun, "Store keys one job may hold (default 100000)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 32));
  app.add_option("--store_total_bytes,--store-total-bytes", limits.maxBytesTotal,
                 "Store bytes every job together may hold (default 1 GiB)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 40));
  app.add_option("--store_total_keys,--store-total-keys", limits.maxKeysTotal,
                 "Store keys every job together may hold (default 1000000)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 32));
  app.add_option("--max_connections,--max-connections", options.maxConnections,
                 "Connections open at once; more are closed as they come (default 0: the open-file limit less a reserve)")
      ->check(CLI::Range(std::size_t{0}, std::size_t{1} << 24));
  double jobIdleSeconds = 120;
  app.add_option("--job_idle_timeout,--job-idle-timeout", jobIdleSeconds,
                 "Seconds after which a job with no agent connected is forgotten (default 120)")
      ->check(CLI::Range(1.0, 86400.0));
  std::string guard;
  app.add_option("--connection_guard,--connection-guard", guard,
                 "on or off. Connections always pass a frame counter that cuts floods of streams or control "
                 "frames (HTTP/2 rapid reset) before gRPC reads them; on (the default, or DDPRUN_RDZV_GUARD; auto "
                 "is on) also holds a connection to a small budget until it shows the job token; off trusts every "
                 "connection at once. Either way an address that broke the limits is refused for a while "
                 "(docs/rendezvous.md)");
  ddprun::AbuseLimits& abuse = options.abuse;
  app.add_option("--max_calls_per_second,--max-calls-per-second", abuse.callsPerSecond,
                 "New calls (streams) one connection may start per second, sustained (default 50)")
      ->check(CLI::Range(1.0, 1e6));
  app.add_option("--max_call_burst,--max-call-burst", abuse.callBurst,
                 "New calls one connection may start at once (default 200)")
      ->check(CLI::Range(1.0, 1e7));
  double maxPenaltySeconds = 60;
  app.add_option("--max_abuse_penalty,--max-abuse-penalty", maxPenaltySeconds,
                 "Longest time an address whose connection broke the call limits is refused, in seconds; the first "
                 "refusal lasts 1 s and each repeat doubles it (default 60)")
      ->check(CLI::Range(1.0, 86400.0));
  app.add_option("--max_streams_per_connection,--max-streams-per-connection", options.maxStreamsPerConnection,
                 "Streams open at once on one connection (HTTP/2 MAX_CONCURRENT_STREAMS; default 100)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--metrics_port,--metrics-port", options.metrics.port,
                 "Serve Prometheus metrics and the /healthz, /readyz probes on this port (0: any free port, "
                 "printed at start; default: none). README \"Metrics\"")
      ->check(CLI::Range(0, 65535));
  app.add_option("--metrics_bind,--metrics-bind", options.metrics.bindAddress,
                 "Address of the metrics port (default 127.0.0.1; a Kubernetes probe needs the pod address)");
  std::size_t memoryQuotaMiB = 1024;
  app.add_option("--grpc_memory_quota,--grpc-memory-quota", memoryQuotaMiB,
                 "MiB of memory gRPC may use for connections and calls (grpc::ResourceQuota; default 1024)")
      ->check(CLI::Range(std::size_t{16}, std::size_t{1} << 20));
  ddprun::TlsServerOptions tls;
  app.add_option("--tls_cert,--tls-cert", tls.certFile,
                 "PEM certificate (chain) of this server: every connection is TLS (README \"Security\")");
  app.add_option("--tls_key,--tls-key", tls.keyFile, "PEM private key of --tls_cert");
  app.add_option("--tls_client_ca,--tls-client-ca", tls.clientCaFile,
                 "PEM CA: require a client certificate signed by it (mTLS)");
  app.add_option("--tls_allowed_names,--tls-allowed-names", tls.allowedNames,
                 "With mTLS: a client certificate must name one of these shell patterns (its CN, DNS, URI "
                 "or e-mail names), comma-separated")
      ->delimiter(',');
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "ddprun-rdzv: error: " << e.what() << "\n";
    return 2;
  }
  sigset_t stopSignals;
  sigemptyset(&stopSignals);
  sigaddset(&stopSignals, SIGINT);
  sigaddset(&stopSignals, SIGTERM);
  sigaddset(&stopSignals, SIGHUP);  // reloads the TLS certificate
  pthread_sigmask(SIG_BLOCK, &stopSignals, nullptr);  // before gRPC starts threads
  try {
    ddprun::setupLogging(logLevel);
    std::string token;
    if (!tokenFile.empty()) {
      token = ddprun::readTokenFile(tokenFile, "--token_file");
    } else if (const char* env = std::getenv("DDPRUN_RDZV_TOKEN")) {
      token = env;
    }
    options.guard = guard.empty() ? ddprun::guardFromEnvironment() : ddprun::parseGuard(guard, "--connection_guard");
    // No children: nothing to give back.
    ddprun::raiseOpenFileLimitForServing(options.reserveFds, options.guard != ddprun::RendezvousServerOptions::Guard::kOff);
    abuse.maxPenalty = std::chrono::milliseconds(static_cast<int64_t>(maxPenaltySeconds * 1000));
    options.memoryQuotaBytes = memoryQuotaMiB << 20;
    options.bindAddress = bind;
    options.port = port;
    options.token = token;
    options.jobIdleTimeout = std::chrono::milliseconds(static_cast<int64_t>(jobIdleSeconds * 1000));
    options.serverName = "ddprun-rdzv " + std::string(ddprun::ddprunVersion());
    if (tls.certFile.empty() != tls.keyFile.empty()) {
      throw ddprun::ConfigError("--tls_cert and --tls_key go together");
    }
    if (tls.certFile.empty() && (!tls.clientCaFile.empty() || !tls.allowedNames.empty())) {
      throw ddprun::ConfigError("--tls_client_ca and --tls_allowed_names need --tls_cert and --tls_key");
    }
    if (!tls.certFile.empty()) options.tls = std::make_shared<ddprun::TlsServerContext>(tls);
    ddprun::RendezvousServer server(options);
    std::cout << "ddprun-rdzv listening on " << server.address() << std::endl;
    if (!server.metricsAddress().empty()) std::cout << "ddprun-rdzv metrics on " << server.metricsAddress() << std::endl;
    int sig = 0;
    for (;;) {
      sigwait(&stopSignals, &sig);
      if (sig != SIGHUP) break;
      // Rotation: new connections get the files as they are now; open ones keep theirs.
      if (!options.tls) {
        spdlog::info("received SIGHUP: no TLS certificate to reload");
        continue;
      }
      try {
        options.tls->reload();
        spdlog::info("received SIGHUP: reloaded the TLS certificate {} (new connections use it)", tls.certFile);
      } catch (const ddprun::ConfigError& e) {
        spdlog::error("received SIGHUP: kept the previous TLS certificate: {}", e.what());
      }
    }
    spdlog::info("received signal {}: shutting down", sig);
    server.shutdown(std::chrono::milliseconds(0));
    return 0;
  } catch (const ddprun::ConfigError& e) {
    std::cerr << "ddprun-rdzv: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "ddprun-rdzv: error: " << e.what() << "\n";
    return 1;
  }
}
