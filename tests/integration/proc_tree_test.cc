// The agent's two ways of finding its descendants (children files, and the whole process table)
// must agree on a real tree: a child, and a grandchild that the child leaves behind.
#include "agent/proc_tree.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

namespace {

using ddprun::proc::listProcesses;
using ddprun::proc::liveDescendants;
using ddprun::proc::liveDescendantsOf;

bool contains(const std::vector<pid_t>& pids, pid_t pid) {
  return std::find(pids.begin(), pids.end(), pid) != pids.end();
}

// Forks a child that forks a sleeping grandchild and writes its pid to `fd`, then sleeps too.
pid_t spawnTree(int fd) {
  pid_t child = ::fork();
  if (child == 0) {
    pid_t grandchild = ::fork();
    if (grandchild == 0) {
      ::pause();
      ::_exit(0);
    }
    (void)!::write(fd, &grandchild, sizeof(grandchild));
    ::pause();
    ::_exit(0);
  }
  return child;
}

}  // namespace

TEST_CASE("proc tree: children files and the process table find the same descendants", "[proc_tree]") {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  pid_t child = spawnTree(fds[1]);
  REQUIRE(child > 0);
  pid_t grandchild = 0;
  REQUIRE(::read(fds[0], &grandchild, sizeof(grandchild)) == sizeof(grandchild));
  ::close(fds[0]);
  ::close(fds[1]);

  auto viaChildren = liveDescendantsOf(::getpid());
  REQUIRE(viaChildren.has_value());  // CONFIG_PROC_CHILDREN is on for every kernel we run on
  auto viaTable = liveDescendants(::getpid(), listProcesses());
  CHECK(contains(*viaChildren, child));
  CHECK(contains(*viaChildren, grandchild));
  CHECK(contains(viaTable, child));
  CHECK(contains(viaTable, grandchild));
  CHECK_FALSE(contains(*viaChildren, ::getpid()));

  // A zombie is not alive: after SIGKILL and before waitpid the child is listed by neither.
  ::kill(grandchild, SIGKILL);
  ::kill(child, SIGKILL);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (contains(*liveDescendantsOf(::getpid()), child) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK_FALSE(contains(*liveDescendantsOf(::getpid()), child));
  CHECK_FALSE(contains(liveDescendants(::getpid(), listProcesses()), child));
  REQUIRE(::waitpid(child, nullptr, 0) == child);
}

TEST_CASE("proc tree: a process that does not exist has no children files", "[proc_tree]") {
  // pid_max is at most 2^22 on Linux: this pid cannot exist.
  CHECK_FALSE(liveDescendantsOf(static_cast<pid_t>(1 << 23)).has_value());
}
