// --numa_binding's four modes on a fake sysfs tree (the topology below), as torch/numa/binding.py
// computes them, and the CPU list parser.
#include "launcher/numa_binding.h"

#include <catch2/catch.hpp>
#include <filesystem>

#include "common/error.h"
#include "test_util.h"

using ddprun::numaBindings;
using ddprun::parseCpuList;
using ddprun::SysfsTopology;
using Set = std::set<int>;

namespace {

// Socket 0 holds NUMA nodes 0 {0,1,4,5} and 1 {2,3,6,7}; socket 1 holds node 2 {8,9,10,11}.
// Physical cores pair i with i+4 (0-7) and 8/10, 9/11; each core has an L3 of its own except on
// node 2, whose four CPUs share one. GPUs 0 and 1 sit on node 0, GPU 2 on node 1, GPU 3 on node 2.
struct FakeSysfs {
  ddprun::test::TempDir dir;

  void put(const std::string& rel, const std::string& text) {
    std::filesystem::path p = std::filesystem::path(dir.path()) / rel;
    std::filesystem::create_directories(p.parent_path());
    ddprun::test::writeFile(p.string(), text + "\n");
  }

  FakeSysfs() {
    put("devices/system/node/node0/cpulist", "0-1,4-5");
    put("devices/system/node/node1/cpulist", "2-3,6-7");
    put("devices/system/node/node2/cpulist", "8-11");
    for (int c = 0; c < 12; ++c) {
      const std::string cpu = "devices/system/cpu/cpu" + std::to_string(c) + "/";
      put(cpu + "topology/physical_package_id", c < 8 ? "0" : "1");
      const std::string siblings = c < 8 ? std::to_string(c % 4) + "," + std::to_string(c % 4 + 4)
                                          : (c % 2 == 0 ? "8,10" : "9,11");
      put(cpu + "topology/thread_siblings_list", siblings);
      put(cpu + "cache/index0/type", "Data");
      put(cpu + "cache/index0/level", "1");
      put(cpu + "cache/index0/shared_cpu_list", siblings);
      put(cpu + "cache/index1/type", "Instruction");
      put(cpu + "cache/index1/level", "9");  // not a data cache: never the largest
      put(cpu + "cache/index1/shared_cpu_list", "0-11");
      put(cpu + "cache/index3/type", "Unified");
      put(cpu + "cache/index3/level", "3");
      put(cpu + "cache/index3/shared_cpu_list", c < 8 ? siblings : "8-11");
    }
    put("bus/pci/devices/0000:3b:00.0/numa_node", "1");
    put("bus/pci/devices/0000:5e:00.0/numa_node", "-1");
  }
};

const std::vector<int> kGpuNodes{0, 0, 1, 2};
const Set kAll{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};

}  // namespace

TEST_CASE("numa: cpu lists as sysfs writes them", "[numa]") {
  CHECK(parseCpuList("0-3,8,10-11") == Set{0, 1, 2, 3, 8, 10, 11});
  CHECK(parseCpuList("5") == Set{5});
  CHECK(parseCpuList("") == Set{});
  CHECK_THROWS_AS(parseCpuList("3-1"), ddprun::Error);
  CHECK_THROWS_AS(parseCpuList("a"), ddprun::Error);
  CHECK_THROWS_AS(parseCpuList("0-99999999"), ddprun::Error);  // bounded
}

TEST_CASE("numa: the topology read from sysfs", "[numa]") {
  FakeSysfs fs;
  SysfsTopology t(fs.dir.path());
  CHECK(t.numaNodes() == std::vector<int>{0, 1, 2});
  CHECK(t.nodeCpus(1) == Set{2, 3, 6, 7});
  CHECK(t.packageOf(9) == 1);
  CHECK(t.threadSiblings(5) == Set{1, 5});
  CHECK(t.largestCacheSharers(9) == Set{8, 9, 10, 11});
  CHECK(t.pciNumaNode("0000:3B:00.0") == 1);  // the driver writes upper case, sysfs lower
  CHECK(t.pciNumaNode("0000:5e:00.0") == -1);
  CHECK(t.pciNumaNode("0000:00:00.9") == -1);  // no such device
}

TEST_CASE("numa: node, socket, exclusive and core-complex bind as torchrun does", "[numa]") {
  FakeSysfs fs;
  SysfsTopology t(fs.dir.path());
  CHECK(numaBindings("node", kGpuNodes, 4, t, kAll) ==
        std::vector<Set>{{0, 1, 4, 5}, {0, 1, 4, 5}, {2, 3, 6, 7}, {8, 9, 10, 11}});
  CHECK(numaBindings("socket", kGpuNodes, 4, t, kAll) ==
        std::vector<Set>{{0, 1, 2, 3, 4, 5, 6, 7}, {0, 1, 2, 3, 4, 5, 6, 7}, {0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11}});
  // Node 0 has two physical cores for its two GPUs: one each, with its hyperthread.
  CHECK(numaBindings("exclusive", kGpuNodes, 4, t, kAll) ==
        std::vector<Set>{{0, 4}, {1, 5}, {2, 3, 6, 7}, {8, 9, 10, 11}});
  CHECK(numaBindings("core-complex", kGpuNodes, 4, t, kAll) ==
        std::vector<Set>{{0, 4}, {1, 5}, {2, 6}, {8, 9, 10, 11}});
  // Fewer ranks than GPUs: the first ranks only.
  CHECK(numaBindings("node", kGpuNodes, 1, t, kAll) == std::vector<Set>{{0, 1, 4, 5}});
}

TEST_CASE("numa: only the CPUs ddprun may use, and clear refusals", "[numa]") {
  FakeSysfs fs;
  SysfsTopology t(fs.dir.path());
  Set allowed = kAll;
  allowed.erase(4);
  CHECK(numaBindings("node", kGpuNodes, 1, t, allowed) == std::vector<Set>{{0, 1, 5}});
  CHECK_THROWS_WITH(numaBindings("node", kGpuNodes, 5, t, kAll), Catch::Contains("local rank 4 has no GPU"));
  CHECK_THROWS_WITH(numaBindings("exclusive", {0, 0, 0}, 3, t, kAll),
                    Catch::Contains("2 physical core(s) for 3 GPUs"));
  // sysfs's -1 (one-node machines, VMs: the GPU machine this was first run on) is node 0, as in torch.
  CHECK(numaBindings("node", {-1, 1}, 2, t, kAll) == std::vector<Set>{{0, 1, 4, 5}, {2, 3, 6, 7}});
  CHECK(numaBindings("exclusive", {-1, 0}, 2, t, kAll) == std::vector<Set>{{0, 4}, {1, 5}});
  CHECK_THROWS_WITH(numaBindings("node", {0}, 1, t, Set{8}), Catch::Contains("no CPU this process may use"));
}
