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
  std::function<bool()> xpusChosen;  // the user named Intel GPUs (ZE_AFFINITY_MASK): auto counts them
};

// The real counts: GPUs through the CUDA driver (dlopen'd, honours CUDA_VISIBLE_DEVICES; when no
// driver is installed, the entries of CUDA_VISIBLE_DEVICES), the CPUs this process may run on
// (its affinity mask, as torch 2.x), Intel GPUs as the
// render nodes of the xe or i915 driver in sysfs (the entries of ZE_AFFINITY_MASK when it is set).
DeviceCounts systemDeviceCounts();

// Throws ConfigError with the reason.
int resolveNprocPerNode(const std::string& value, const DeviceCounts& counts);

}  // namespace ddprun
