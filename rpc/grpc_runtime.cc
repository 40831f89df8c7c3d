#include "rpc/grpc_runtime.h"

#include <absl/synchronization/mutex.h>
#include <grpc/support/log.h>
#include <spdlog/spdlog.h>

#include <mutex>

namespace ddprun {

void prepareGrpcRuntime() {
  static std::once_flag once;
  std::call_once(once, [] {
    gpr_set_log_function([](gpr_log_func_args* args) { spdlog::debug("grpc: {}", args->message); });
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  });
}

}  // namespace ddprun
