#include "proc_sample.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace capacity {

ProcSample sampleProc(pid_t pid) {
  ProcSample s;
  const std::string dir = pid > 0 ? "/proc/" + std::to_string(pid) : std::string("/proc/self");
  std::ifstream stat(dir + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return s;
  auto close = line.rfind(')');
  if (close == std::string::npos) return s;
  std::istringstream fields(line.substr(close + 2));
  std::string f;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; fields >> f; ++i) {  // field 3 is the state
    if (i == 14) utime = std::strtoull(f.c_str(), nullptr, 10);
    if (i == 15) {
      stime = std::strtoull(f.c_str(), nullptr, 10);
      break;
    }
  }
  s.cpuS = static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
  std::ifstream status(dir + "/status");
  while (std::getline(status, line)) {
    auto value = [&] { return std::strtol(line.c_str() + line.find(':') + 1, nullptr, 10); };
    if (line.rfind("VmRSS:", 0) == 0) s.rssKb = value();
    if (line.rfind("VmHWM:", 0) == 0) s.hwmKb = value();
    if (line.rfind("Threads:", 0) == 0) s.threads = value();
  }
  s.ok = true;
  return s;
}

}  // namespace capacity
