#include "worker_sdk/version.h"

#include "ddprun_build_info.h"  // generated: cmake/WriteBuildInfo.cmake
#include "worker_sdk/backends.h"

namespace ddp {

std::string version() { return DDPRUN_VERSION_STRING; }

std::string buildInfo() {
  return std::string("libddp ") + DDPRUN_VERSION_STRING + " (commit " + DDPRUN_GIT_COMMIT + ", " + DDPRUN_BUILD_TYPE +
         "); backends: gloo, " + (detail::ncclBuilt() ? "nccl" : "nccl not built in");
}

}  // namespace ddp
