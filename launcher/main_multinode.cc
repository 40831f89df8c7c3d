// ddprun-multinode: ddprun with the gRPC rendezvous linked in. ddprun execs it for multi-node jobs
// with the same arguments; it is not meant to be started by hand, but it works if it is.
#include <iostream>

#include "common/error.h"
#include "launcher/cli.h"
#include "launcher/launch.h"
#include "launcher/multinode.h"

int main(int argc, char** argv) {
  auto parsed = ddprun::parseCommandLine(argc, argv);
  if (parsed.kind == ddprun::ParseResult::Kind::kExit) return parsed.exitStatus;
  try {
    if (parsed.config.dryRun) return ddprun::printDryRun(parsed.config);
    return ddprun::launch(parsed.config, ddprun::startMultiNode);
  } catch (const ddprun::ConfigError& e) {
    std::cerr << "ddprun: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "ddprun: error: " << e.what() << "\n";
    return 1;
  }
}
