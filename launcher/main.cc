// ddprun: a drop-in replacement for torchrun. See README.md for the flags and exit statuses.
// Multi-node jobs are handed to ddprun-multinode (see launcherMain).
#include <google/protobuf/stubs/common.h>

#include "common/build_info.h"
#include "launcher/launch.h"

int main(int argc, char** argv) {
  return ddprun::launcherMain(argc, argv, nullptr, [] {
    auto links = ddprun::loggingLinks();
    links.push_back(ddprun::boostLink());
    links.push_back(ddprun::cxxRuntimeLink());
    // torch's store runs on the store core, whose messages are protobuf's.
    links.push_back("protobuf " + google::protobuf::internal::VersionString(GOOGLE_PROTOBUF_VERSION) +
                    (DDPRUN_PROTOBUF_COMPILED_IN ? " (compiled in)" : " (shared)"));
    links.push_back("no gRPC (multi-node jobs run ddprun-multinode, beside it)");
    return ddprun::versionText("ddprun", links);
  });
}
