// --nproc_per_node: a number, or auto/cpu/gpu counted on this machine.
#pragma once

#include <functional>
#include <string>

namespace ddprun {

constexpr int kMaxNprocPerNode = 1024;

struct DeviceCounts {
  std::function<int()> gpus;  // CUDA devices visible to this process
  std::function<int()> cpus;
  std::function<int()> xpus;  // Intel GPUs (torchrun's --nproc_per_node=xpu)
};

// The real counts: GPUs through the CUDA driver (dlopen'd, honours CUDA_VISIBLE_DEVICES; when no
// driver is installed, the entries of CUDA_VISIBLE_DEVICES), CPUs online, Intel GPUs as the
// render nodes of the xe or i915 driver in sysfs (the entries of ZE_AFFINITY_MASK when it is set).
DeviceCounts systemDeviceCounts();

// Throws ConfigError with the reason.
int resolveNprocPerNode(const std::string& value, const DeviceCounts& counts);

}  // namespace ddprun
