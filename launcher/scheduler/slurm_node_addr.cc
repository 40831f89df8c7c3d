#include "launcher/scheduler/slurm_node_addr.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "common/unique_fd.h"

extern char** environ;

namespace ddprun {
namespace {

// scontrol's answer for one node is a few hundred bytes; more is not an answer.
constexpr std::size_t kMaxOutputBytes = 64 * 1024;

}  // namespace

std::optional<std::string> parseNodeAddr(std::string_view output) {
  constexpr std::string_view kKey = "NodeAddr=";
  for (std::size_t at = output.find(kKey); at != std::string_view::npos; at = output.find(kKey, at + 1)) {
    if (at > 0 && output[at - 1] != ' ' && output[at - 1] != '\n' && output[at - 1] != '\t') continue;
    std::size_t start = at + kKey.size();
    std::size_t end = output.find_first_of(" \t\n", start);
    std::string value(output.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start));
    if (value.empty() || value == "(null)") return std::nullopt;
    return value;
  }
  return std::nullopt;
}

std::optional<std::string> querySlurmNodeAddr(const std::string& node, std::chrono::milliseconds timeout) {
  Pipe pipe = makePipe();
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, pipe.write.get(), 1);  // dup2 clears close-on-exec
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  std::vector<std::string> args{"scontrol", "-o", "show", "node", node};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  int rc = ::posix_spawnp(&pid, "scontrol", &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  pipe.write.reset();
  if (rc != 0) return std::nullopt;

  std::string output;
  bool complete = false;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (output.size() < kMaxOutputBytes) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{pipe.read.get(), POLLIN, 0};
    int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) break;
    char buf[4096];
    ssize_t n = ::read(pipe.read.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      complete = n == 0;
      break;
    }
    output.append(buf, static_cast<std::size_t>(n));
  }
  if (!complete) ::kill(pid, SIGKILL);  // out of time or too talkative: no answer
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!complete || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return std::nullopt;
  auto addr = parseNodeAddr(output);
  if (addr == node) return std::nullopt;
  return addr;
}

}  // namespace ddprun
