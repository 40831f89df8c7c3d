#include "launcher/numa_binding.h"

#include <dlfcn.h>
#include <sched.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "common/error.h"
#include "common/strings.h"

namespace ddprun {
namespace {

namespace fs = std::filesystem;

std::string readSmall(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw Error("cannot read " + path.string());
  std::string text;
  std::getline(in, text);
  return std::string(trim(text));
}

int readInt(const fs::path& path) {
  auto value = parseInt(readSmall(path));
  if (!value) throw Error("not a number in " + path.string());
  return static_cast<int>(*value);
}

fs::path cpuDir(const std::string& root, int cpu) {
  return fs::path(root) / "devices/system/cpu" / ("cpu" + std::to_string(cpu));
}

template <typename Key>
std::map<Key, std::set<int>> groupBy(const std::set<int>& cpus, const std::function<Key(int)>& key) {
  std::map<Key, std::set<int>> groups;
  for (int cpu : cpus) groups[key(cpu)].insert(cpu);
  return groups;
}

// The GPUs of deviceNodes on `node`, in order, and where `device` is among them.
std::pair<std::size_t, std::size_t> placeAmongNodePeers(const std::vector<int>& deviceNodes, int device) {
  std::size_t peers = 0, index = 0;
  for (int d = 0; d < static_cast<int>(deviceNodes.size()); ++d) {
    if (deviceNodes[static_cast<std::size_t>(d)] != deviceNodes[static_cast<std::size_t>(device)]) continue;
    if (d == device) index = peers;
    ++peers;
  }
  return {index, peers};
}

}  // namespace

std::set<int> parseCpuList(const std::string& text) {
  std::set<int> cpus;
  for (const auto& part : split(text, ',')) {
    std::string_view item = trim(part);
    if (item.empty()) continue;
    auto dash = item.find('-');
    auto first = parseInt(item.substr(0, dash));
    auto last = dash == std::string_view::npos ? first : parseInt(item.substr(dash + 1));
    if (!first || !last || *first < 0 || *last < *first || *last - *first > 65536) {
      throw Error("not a CPU list: '" + std::string(text.substr(0, 64)) + "'");
    }
    for (auto c = *first; c <= *last; ++c) cpus.insert(static_cast<int>(c));
  }
  return cpus;
}

std::vector<int> SysfsTopology::numaNodes() const {
  std::vector<int> nodes;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(fs::path(root_) / "devices/system/node", ec)) {
    std::string name = entry.path().filename().string();
    if (name.size() > 4 && name.starts_with("node") && std::all_of(name.begin() + 4, name.end(), ::isdigit)) {
      nodes.push_back(std::stoi(name.substr(4)));
    }
  }
  std::sort(nodes.begin(), nodes.end());
  return nodes;
}

std::set<int> SysfsTopology::nodeCpus(int node) const {
  return parseCpuList(readSmall(fs::path(root_) / "devices/system/node" / ("node" + std::to_string(node)) / "cpulist"));
}

int SysfsTopology::packageOf(int cpu) const { return readInt(cpuDir(root_, cpu) / "topology/physical_package_id"); }

std::set<int> SysfsTopology::threadSiblings(int cpu) const {
  return parseCpuList(readSmall(cpuDir(root_, cpu) / "topology/thread_siblings_list"));
}

std::set<int> SysfsTopology::largestCacheSharers(int cpu) const {
  int best = -1;
  std::set<int> sharers{cpu};
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(cpuDir(root_, cpu) / "cache", ec)) {
    std::string name = entry.path().filename().string();
    if (!name.starts_with("index")) continue;
    std::string type = readSmall(entry.path() / "type");
    if (type != "Unified" && type != "Data") continue;
    int level = readInt(entry.path() / "level");
    if (level <= best) continue;
    best = level;
    sharers = parseCpuList(readSmall(entry.path() / "shared_cpu_list"));
  }
  return sharers;
}

int SysfsTopology::pciNumaNode(const std::string& busId) const {
  std::string id = busId;
  std::transform(id.begin(), id.end(), id.begin(), [](unsigned char c) { return std::tolower(c); });
  try {
    return readInt(fs::path(root_) / "bus/pci/devices" / id / "numa_node");
  } catch (const Error&) {
    return -1;
  }
}

std::vector<std::set<int>> numaBindings(const std::string& mode, const std::vector<int>& deviceNodes, int nproc,
                                        const SysfsTopology& topology, const std::set<int>& allowed) {
  std::vector<int> nodesOf = deviceNodes;  // peers are counted by the node actually used
  for (int& n : nodesOf) n = std::max(n, 0);
  auto allowedOf = [&](int node) {
    std::set<int> cpus;
    for (int c : topology.nodeCpus(node)) {
      if (allowed.count(c)) cpus.insert(c);
    }
    return cpus;
  };
  std::vector<std::set<int>> out;
  for (int rank = 0; rank < nproc; ++rank) {
    if (rank >= static_cast<int>(deviceNodes.size())) {
      throw ConfigError("--numa_binding=" + mode + ": local rank " + std::to_string(rank) + " has no GPU (" +
                        std::to_string(deviceNodes.size()) + " visible); the binding follows GPU i for local rank i");
    }
    // -1: the platform does not say, as on machines (and VMs) with one NUMA node; node 0, as torch.
    const int node = std::max(deviceNodes[static_cast<std::size_t>(rank)], 0);
    std::set<int> cpus;
    if (mode == "node") {
      cpus = allowedOf(node);
    } else if (mode == "socket") {
      const std::set<int> own = allowedOf(node);
      if (own.empty()) throw ConfigError("--numa_binding=socket: NUMA node " + std::to_string(node) + " has no allowed CPU");
      const int socket = topology.packageOf(*own.begin());
      for (int other : topology.numaNodes()) {
        std::set<int> theirs = allowedOf(other);
        if (!theirs.empty() && topology.packageOf(*theirs.begin()) == socket) cpus.insert(theirs.begin(), theirs.end());
      }
    } else if (mode == "exclusive") {
      auto cores = groupBy<int>(allowedOf(node), [&](int c) { return *topology.threadSiblings(c).begin(); });
      auto [index, peers] = placeAmongNodePeers(nodesOf, rank);
      const std::size_t each = cores.size() / peers, extra = cores.size() % peers;
      if (each < 1) {
        throw ConfigError("--numa_binding=exclusive: NUMA node " + std::to_string(node) + " has " +
                          std::to_string(cores.size()) + " physical core(s) for " + std::to_string(peers) + " GPUs");
      }
      const std::size_t start = index * each + std::min(index, extra);
      const std::size_t end = start + each + (index < extra ? 1 : 0);
      std::size_t i = 0;
      for (const auto& [core, logical] : cores) {
        if (i >= start && i < end) cpus.insert(logical.begin(), logical.end());
        ++i;
      }
    } else if (mode == "core-complex") {
      auto groups = groupBy<int>(allowedOf(node), [&](int c) { return *topology.largestCacheSharers(c).begin(); });
      std::vector<std::pair<int, std::set<int>>> ordered(groups.begin(), groups.end());
      std::stable_sort(ordered.begin(), ordered.end(),
                       [](const auto& a, const auto& b) { return a.second.size() > b.second.size(); });
      if (!ordered.empty()) {
        auto [index, peers] = placeAmongNodePeers(nodesOf, rank);
        (void)peers;
        cpus = ordered[index % ordered.size()].second;
      }
    } else {
      throw ConfigError("--numa_binding '" + mode + "': expected node, socket, exclusive or core-complex");
    }
    if (cpus.empty()) {
      throw ConfigError("--numa_binding=" + mode + ": no CPU this process may use is near GPU " + std::to_string(rank));
    }
    out.push_back(std::move(cpus));
  }
  return out;
}

std::vector<std::string> cudaPciBusIds() {
  std::vector<std::string> ids;
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return ids;
  using InitFn = int (*)(unsigned);
  using CountFn = int (*)(int*);
  using GetFn = int (*)(int*, int);
  using BusIdFn = int (*)(char*, int, int);
  auto init = reinterpret_cast<InitFn>(::dlsym(lib, "cuInit"));
  auto count = reinterpret_cast<CountFn>(::dlsym(lib, "cuDeviceGetCount"));
  auto get = reinterpret_cast<GetFn>(::dlsym(lib, "cuDeviceGet"));
  auto busId = reinterpret_cast<BusIdFn>(::dlsym(lib, "cuDeviceGetPCIBusId"));
  int devices = 0;
  if (init && count && get && busId && init(0) == 0 && count(&devices) == 0) {
    for (int i = 0; i < devices; ++i) {
      int device = 0;
      char text[32] = {};
      if (get(&device, i) != 0 || busId(text, sizeof(text), device) != 0) break;
      ids.emplace_back(text);
    }
  }
  ::dlclose(lib);
  return ids;
}

std::set<int> allowedCpus() {
  std::set<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.insert(c);
  }
  return cpus;
}

}  // namespace ddprun
