#include "rpc/grpc_runtime.h"

#include <absl/synchronization/mutex.h>
#include <google/protobuf/stubs/common.h>
#include <grpc/support/log.h>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <mutex>

namespace ddprun {

void prepareGrpcRuntime() {
  static std::once_flag once;
  std::call_once(once, [] {
    // gRPC's own lines go to ddprun's log at debug level, unless the user asked gRPC for them
    // (GRPC_VERBOSITY, as gRPC documents, e.g. with GRPC_TRACE=http_keepalive): then gRPC writes
    // them to stderr itself, at the level asked.
    if (std::getenv("GRPC_VERBOSITY") == nullptr) {
      gpr_set_log_function([](gpr_log_func_args* args) { spdlog::debug("grpc: {}", args->message); });
    }
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  });
}

std::vector<std::string> grpcLinks(bool compiledIn) {
  const char* how = compiledIn ? "compiled in" : "shared";
  return {"gRPC " + grpc::Version() + " (" + how + ")",
          "protobuf " + google::protobuf::internal::VersionString(GOOGLE_PROTOBUF_VERSION) + " (" + how + ")"};
}

}  // namespace ddprun
