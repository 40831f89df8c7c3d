// The backends' factories (internal), called by makeCommunicator(). The NCCL one is defined by
// nccl_communicator.cc when CMake found CUDA and NCCL, else by nccl_unavailable.cc.
#pragma once

#include <memory>
#include <string>

#include "worker_sdk/communicator.h"

namespace ddp::detail {

std::unique_ptr<Communicator> makeGlooCommunicator(const Env& env, Store& store, const CommunicatorOptions& options);

bool ncclBuilt();
std::unique_ptr<Communicator> makeNcclCommunicator(const Env& env, Store& store, const CommunicatorOptions& options);
// A fresh ncclUniqueId as bytes (ncclGetUniqueId; needs no GPU). ConfigError without NCCL.
std::string newNcclUniqueId();
// whyBackendUnusable(kNccl): not built, or no CUDA device (with CUDA's message); empty if usable.
std::string ncclUnusableReason();
// cudaGetDeviceCount, or 0 when there is no driver, no device, or no CUDA in this build.
int cudaDeviceCount();

// The store keys of one communicator: "ddp/<backend>/<name>/".
std::string keyPrefix(Backend backend, const CommunicatorOptions& options);

}  // namespace ddp::detail
