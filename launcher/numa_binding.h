// torchrun's --numa_binding: each worker (local rank i uses GPU i, as torchrun assumes) is bound to
// CPUs near its GPU, with torchrun's four modes (torch/numa/binding.py):
//   node          every allowed CPU of the GPU's NUMA node;
//   socket        every allowed CPU of the NUMA nodes in the GPU's socket;
//   exclusive     the node's physical cores split evenly among the GPUs of that node (the first
//                 GPUs get one more when they do not divide), with their hyperthreads;
//   core-complex  one group of CPUs sharing the largest cache (an L3 "core complex") per GPU,
//                 largest groups first, round robin over the GPUs of the node.
// "Allowed" is ddprun's own affinity (a cpuset or taskset from the scheduler wins). The topology
// comes from sysfs, the GPU's PCI address from the CUDA driver.
#pragma once

#include <set>
#include <string>
#include <vector>

namespace ddprun {

// sysfs as the binding needs it; `root` is "/sys", or a fake tree in tests.
class SysfsTopology {
 public:
  explicit SysfsTopology(std::string root = "/sys") : root_(std::move(root)) {}

  std::vector<int> numaNodes() const;                 // node ids present
  std::set<int> nodeCpus(int node) const;             // throws Error when the node has no cpulist
  int packageOf(int cpu) const;                       // physical_package_id
  std::set<int> threadSiblings(int cpu) const;        // the logical CPUs of cpu's physical core
  std::set<int> largestCacheSharers(int cpu) const;   // CPUs sharing its largest data/unified cache
  // The NUMA node of a PCI device ("0000:3b:00.0"), -1 when the platform does not say.
  int pciNumaNode(const std::string& busId) const;

 private:
  std::string root_;
};

// "0-3,8,10-11" -> {0,1,2,3,8,10,11}; throws Error on anything else.
std::set<int> parseCpuList(const std::string& text);

// The CPUs of each local rank 0..nproc-1. deviceNodes[i] is GPU i's NUMA node (-1, "unknown", as
// sysfs says on one-node machines and most VMs, counts as node 0, as in torch); allowed is the
// set ddprun may use. Throws ConfigError when a rank has no GPU, or when the topology leaves a
// rank no CPU (exclusive with fewer cores than GPUs).
std::vector<std::set<int>> numaBindings(const std::string& mode, const std::vector<int>& deviceNodes, int nproc,
                                        const SysfsTopology& topology, const std::set<int>& allowed);

// PCI addresses of the visible CUDA devices, in CUDA's order (the driver, dlopen'd); empty when
// there is no driver or no device.
std::vector<std::string> cudaPciBusIds();

// ddprun's own CPU affinity.
std::set<int> allowedCpus();

}  // namespace ddprun
