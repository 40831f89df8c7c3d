#include "launcher/nproc.h"

#include <dlfcn.h>
#include <sched.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "common/error.h"
#include "common/strings.h"

namespace ddprun {
namespace {

int countVisibleDevicesVariable(const char* visible) {
  int count = 0;
  for (const auto& entry : split(visible, ',')) {
    auto id = trim(entry);
    if (id.empty() || id[0] == '-') break;  // CUDA stops at the first invalid entry
    ++count;
  }
  return count;
}

int countCudaDevices() {
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    return visible ? countVisibleDevicesVariable(visible) : 0;
  }
  using InitFn = int (*)(unsigned);
  using CountFn = int (*)(int*);
  auto init = reinterpret_cast<InitFn>(::dlsym(lib, "cuInit"));
  auto count = reinterpret_cast<CountFn>(::dlsym(lib, "cuDeviceGetCount"));
  int devices = 0;
  if (!init || !count || init(0) != 0 || count(&devices) != 0) devices = 0;
  ::dlclose(lib);
  return devices;
}

}  // namespace

int countIntelGpus() {
  if (const char* mask = std::getenv("ZE_AFFINITY_MASK")) {
    int n = 0;
    for (const auto& part : split(mask, ',')) n += trim(part).empty() ? 0 : 1;
    return n;
  }
  namespace fs = std::filesystem;
  std::error_code ec;
  int n = 0;
  for (const auto& entry : fs::directory_iterator("/sys/class/drm", ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with("renderD")) continue;
    const std::string driver = fs::read_symlink(entry.path() / "device" / "driver", ec).filename().string();
    if (!ec && (driver == "xe" || driver == "i915")) ++n;
  }
  return n;
}

// The CPUs this process may run on (taskset, a cpuset cgroup), as torch 2.x counts them for
// auto/cpu (torch._utils.cpu_count); the online CPUs when the mask cannot be read.
int countUsableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
}

DeviceCounts systemDeviceCounts() {
  return DeviceCounts{countCudaDevices, countUsableCpus, countIntelGpus, [] { return std::getenv("ZE_AFFINITY_MASK") != nullptr; }};
}

int resolveNprocPerNode(const std::string& value, const DeviceCounts& counts) {
  if (value == "cpu") return counts.cpus();
  if (value == "gpu") {
    int gpus = counts.gpus();
    if (gpus <= 0) throw ConfigError("--nproc_per_node=gpu: no CUDA device is visible on this machine");
    return gpus;
  }
  if (value == "xpu") {
    int xpus = counts.xpus ? counts.xpus() : 0;
    if (xpus <= 0) throw ConfigError("--nproc_per_node=xpu: no Intel GPU (XPU) is visible on this machine");
    return xpus;
  }
  if (value == "auto") {
    // torch 2.x: its accelerator's devices, else the CPUs. Its accelerator is CUDA in a CUDA
    // build, XPU in an XPU build; ddprun cannot tell the workers' build, so Intel GPUs count only
    // when ZE_AFFINITY_MASK names them (a machine's integrated GPU must not turn auto into 1).
    int gpus = counts.gpus();
    if (gpus > 0) return gpus;
    if (counts.xpusChosen && counts.xpusChosen() && counts.xpus) {
      int xpus = counts.xpus();
      if (xpus > 0) return xpus;
    }
    return counts.cpus();
  }
  auto n = parseInt(value);
  if (!n) throw ConfigError("--nproc_per_node '" + value + "': expected a number, auto, cpu, gpu or xpu");
  if (*n < 1 || *n > kMaxNprocPerNode) {
    throw ConfigError("--nproc_per_node " + value + ": must be between 1 and " + std::to_string(kMaxNprocPerNode));
  }
  return static_cast<int>(*n);
}

}  // namespace ddprun
