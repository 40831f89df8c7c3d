// ddprun: a drop-in replacement for torchrun. See README.md for the flags and exit statuses.
// Multi-node jobs are handed to ddprun-multinode (see launcherMain).
#include "common/build_info.h"
#include "launcher/launch.h"

int main(int argc, char** argv) {
  return ddprun::launcherMain(argc, argv, nullptr, [] {
    auto links = ddprun::loggingLinks();
    links.push_back(ddprun::boostLink());
    links.push_back(ddprun::cxxRuntimeLink());
    links.push_back("no gRPC (multi-node jobs run ddprun-multinode, beside it)");
    return ddprun::versionText("ddprun", links);
  });
}
