// CUDA and NCCL result codes turned into exceptions once, at the call, with file:line (internal;
// only in builds with CUDA and NCCL).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

namespace ddp::detail {

// ddprun::Error("file:line: expr: <CUDA's message>") unless result is cudaSuccess.
void checkCuda(cudaError_t result, const char* expr, const char* file, int line);
// ddprun::Error("file:line: expr: <NCCL's message> (<ncclGetLastError>)") unless ncclSuccess or,
// for a non-blocking communicator, ncclInProgress. Returns result.
ncclResult_t checkNccl(ncclResult_t result, ncclComm_t comm, const char* expr, const char* file, int line);

}  // namespace ddp::detail

#define DDP_CUDA_CHECK(expr) ::ddp::detail::checkCuda((expr), #expr, __FILE__, __LINE__)
#define DDP_NCCL_CHECK(expr, comm) ::ddp::detail::checkNccl((expr), (comm), #expr, __FILE__, __LINE__)
