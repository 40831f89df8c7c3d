#include "worker_sdk/nccl_check.h"

#include <string>

#include "common/error.h"

namespace ddp::detail {

void checkCuda(cudaError_t result, const char* expr, const char* file, int line) {
  if (result == cudaSuccess) return;
  throw ddprun::Error(std::string(file) + ":" + std::to_string(line) + ": " + expr + ": " +
                      cudaGetErrorName(result) + ": " + cudaGetErrorString(result));
}

ncclResult_t checkNccl(ncclResult_t result, ncclComm_t comm, const char* expr, const char* file, int line) {
  if (result == ncclSuccess || result == ncclInProgress) return result;
  std::string msg = std::string(file) + ":" + std::to_string(line) + ": " + expr + ": " + ncclGetErrorString(result);
  const char* last = ncclGetLastError(comm);
  if (last && *last) msg += std::string(" (") + last + ")";
  throw ddprun::Error(msg);
}

}  // namespace ddp::detail
