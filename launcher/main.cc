// ddprun: a drop-in replacement for torchrun. See README.md for the flags and exit statuses.
#include <spdlog/spdlog.h>

#include <iostream>

#include "common/error.h"
#include "launcher/cli.h"
#include "launcher/launch.h"

int main(int argc, char** argv) {
  auto parsed = ddprun::parseCommandLine(argc, argv);
  if (parsed.kind == ddprun::ParseResult::Kind::kExit) return parsed.exitStatus;
  try {
    if (parsed.config.dryRun) return ddprun::printDryRun(parsed.config);
    return ddprun::launch(parsed.config);
  } catch (const ddprun::ConfigError& e) {
    std::cerr << "ddprun: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "ddprun: error: " << e.what() << "\n";
    return 1;
  }
}
