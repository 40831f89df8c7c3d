#include "agent/stack_dump.h"

#include <unistd.h>

#include <climits>
#include <string_view>

namespace ddprun {
namespace {

std::size_t lastDumpStart(const std::vector<std::string>& lines) {
  for (std::size_t i = lines.size(); i-- > 0;) {
    if (std::string_view(lines[i]).starts_with("Fatal Python error: Aborted")) return i;
  }
  return lines.size();
}

}  // namespace

bool isPythonProcess(pid_t pid) {
  char buf[PATH_MAX];
  std::string link = "/proc/" + std::to_string(pid) + "/exe";
  ssize_t n = ::readlink(link.c_str(), buf, sizeof(buf) - 1);
  if (n <= 0) return false;
  std::string_view exe(buf, static_cast<std::size_t>(n));
  if (exe.ends_with(" (deleted)")) exe.remove_suffix(10);
  auto slash = exe.rfind('/');
  if (slash != std::string_view::npos) exe.remove_prefix(slash + 1);
  return exe.starts_with("python");
}

std::vector<std::string> faulthandlerDump(const std::vector<std::string>& stderrLines) {
  std::size_t start = lastDumpStart(stderrLines);
  std::vector<std::string> dump;
  for (std::size_t i = start; i < stderrLines.size(); ++i) {
    // Python 3.11 ends the dump with one long line of the C extension modules loaded: not a stack.
    if (std::string_view(stderrLines[i]).starts_with("Extension modules:")) break;
    if (dump.size() == kMaxStackDumpLines) {
      dump.push_back("... (" + std::to_string(stderrLines.size() - i) + " more lines)");
      break;
    }
    dump.push_back(stderrLines[i]);
  }
  while (!dump.empty() && dump.back().empty()) dump.pop_back();
  return dump;
}

std::vector<std::string> beforeFaulthandlerDump(const std::vector<std::string>& stderrLines) {
  return {stderrLines.begin(), stderrLines.begin() + static_cast<std::ptrdiff_t>(lastDumpStart(stderrLines))};
}

}  // namespace ddprun
