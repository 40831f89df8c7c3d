// The NCCL factory of a build without CUDA or NCCL: the nccl backend reports itself missing.
#include "common/error.h"
#include "worker_sdk/backends.h"

namespace ddp::detail {

namespace {

constexpr const char* kNotBuilt =
    "is not available: libddp was built without CUDA and NCCL (CMake found none); use backend 'gloo'";

[[noreturn]] void notBuilt() { throw ddprun::ConfigError(std::string("backend 'nccl' ") + kNotBuilt); }

}  // namespace

bool ncclBuilt() { return false; }

std::unique_ptr<Communicator> makeNcclCommunicator(const Env&, Store&, const CommunicatorOptions&) { notBuilt(); }

std::string newNcclUniqueId() { notBuilt(); }

std::string ncclUnusableReason() { return kNotBuilt; }

int cudaDeviceCount() { return 0; }

}  // namespace ddp::detail
