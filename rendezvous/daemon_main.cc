// ddprun-rdzv: the standalone rendezvous daemon. Serves many jobs (by run id) and keeps running
// between them, so that a job does not depend on the agent that would otherwise host it.
#include <signal.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <fstream>
#include <iostream>

#include "common/error.h"
#include "common/logging.h"
#include "common/strings.h"
#include "rendezvous/rendezvous_server.h"

int main(int argc, char** argv) {
  CLI::App app{"ddprun-rdzv: the standalone rendezvous and store server for ddprun jobs", "ddprun-rdzv"};
  int port = 29400;
  std::string bind = "127.0.0.1";
  std::string tokenFile;
  std::string logLevel = "info";
  app.add_option("--port", port, "Port to listen on (0: any free port, printed at start)")->check(CLI::Range(0, 65535));
  app.add_option("--bind", bind, "Address to listen on; 0.0.0.0 or :: listens on every interface");
  app.add_option("--token_file,--token-file", tokenFile, "File holding the job token (else DDPRUN_RDZV_TOKEN)");
  app.add_option("--log_level,--log-level", logLevel, "debug, info, warning, error");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "ddprun-rdzv: error: " << e.what() << "\n";
    return 2;
  }
  sigset_t stopSignals;
  sigemptyset(&stopSignals);
  sigaddset(&stopSignals, SIGINT);
  sigaddset(&stopSignals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stopSignals, nullptr);  // before gRPC starts threads
  try {
    ddprun::setupLogging(logLevel);
    ddprun::raiseOpenFileLimitForServing();  // no children: nothing to give back
    std::string token;
    if (!tokenFile.empty()) {
      std::ifstream in(tokenFile);
      if (!in) throw ddprun::ConfigError("cannot read token file " + tokenFile);
      std::getline(in, token);
      token = std::string(ddprun::trim(token));
      if (token.empty()) throw ddprun::ConfigError("token file " + tokenFile + " is empty");
    } else if (const char* env = std::getenv("DDPRUN_RDZV_TOKEN")) {
      token = env;
    }
    ddprun::RendezvousServer server({bind, port, token});
    std::cout << "ddprun-rdzv listening on " << server.address() << std::endl;
    int sig = 0;
    sigwait(&stopSignals, &sig);
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
