// ddprun: a drop-in replacement for torchrun. See README.md for the flags and exit statuses.
// Single-node jobs run here; multi-node jobs exec ddprun-multinode (same launcher plus the gRPC
// rendezvous), so that the common single-node agent never loads gRPC.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <iostream>

#include "common/error.h"
#include "launcher/cli.h"
#include "launcher/launch.h"

namespace {

int execMultiNode(char** argv) {
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  std::string path = ec ? "ddprun-multinode" : (self.parent_path() / "ddprun-multinode").string();
  ::execv(path.c_str(), argv);
  std::cerr << "ddprun: error: multi-node jobs need " << path << " next to ddprun: " << std::strerror(errno) << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  auto parsed = ddprun::parseCommandLine(argc, argv);
  if (parsed.kind == ddprun::ParseResult::Kind::kExit) return parsed.exitStatus;
  try {
    if (parsed.config.dryRun) return ddprun::printDryRun(parsed.config);
    if (parsed.config.multiNode) return execMultiNode(argv);
    return ddprun::launch(parsed.config, nullptr);
  } catch (const ddprun::ConfigError& e) {
    std::cerr << "ddprun: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "ddprun: error: " << e.what() << "\n";
    return 1;
  }
}
