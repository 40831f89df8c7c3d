// Stale job cgroups (agent/cgroup_sweep.h) on the real cgroup v2 hierarchy: one that no agent holds
// and no process is in is removed, leaves included; one a live agent holds (empty, as while it
// waits for its rendezvous) or one with a process in it is kept; an agent's own is never swept.
#include "agent/cgroup_sweep.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>

#include "agent/job_cgroup.h"
#include "test_skip.h"

namespace {

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::string parentOf(const std::string& path) { return path.substr(0, path.rfind('/')); }

}  // namespace

TEST_CASE("cgroup sweep: removes a job cgroup nobody holds, keeps a held or populated one", "[supervisor][cgroup]") {
  std::string why;
  auto own = ddprun::JobCgroup::create("ddprun-sweep-own-" + std::to_string(::getpid()), &why);
  if (!own) DDPRUN_SKIP("no job cgroup can be made here: " + why);
  const std::string parent = parentOf(own->path());
  const std::string tag = std::to_string(::getpid());

  // Left behind by an agent killed with its watchdog: made, never locked by anyone alive, with a leaf.
  const std::string stale = parent + "/ddprun-sweep-stale-" + tag;
  REQUIRE(::mkdir(stale.c_str(), 0755) == 0);
  REQUIRE(::mkdir((stale + "/w1").c_str(), 0755) == 0);
  // Another agent's, alive and still empty.
  auto held = ddprun::JobCgroup::create("ddprun-sweep-held-" + tag, &why);
  REQUIRE(held);
  // Nobody holds it, but a process is in it: kept, and the process is not killed.
  const std::string populated = parent + "/ddprun-sweep-populated-" + tag;
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::pause();
    ::_exit(0);
  }
  // Whatever fails below, the child must not outlive the test: it holds ctest's output pipe, and
  // ctest would wait for it until its timeout.
  struct KillAtEnd {
    pid_t pid;
    ~KillAtEnd() {
      if (pid > 0 && ::kill(pid, SIGKILL) == 0) ::waitpid(pid, nullptr, 0);
    }
  } killAtEnd{child};
  // Empty and unheld until the child is in it, the cgroup is stale to any other test's watchdog
  // sweeping meanwhile (ctest -j2), which may remove it between the mkdir and the write (CI saw
  // the write fail so): made again, a bounded number of times.
  bool placed = false;
  for (int i = 0; i < 100 && !placed; ++i) {
    ::mkdir(populated.c_str(), 0755);
    if (FILE* procs = std::fopen((populated + "/cgroup.procs").c_str(), "w")) {
      std::fprintf(procs, "%d", static_cast<int>(child));
      placed = std::fclose(procs) == 0;
    }
  }
  REQUIRE(placed);
  // Not a job cgroup at all: never touched.
  const std::string other = parent + "/not-ddprun-sweep-" + tag;
  REQUIRE(::mkdir(other.c_str(), 0755) == 0);

  // Other tests' watchdogs sweep the same parent meanwhile (ctest -j2): one of them may hold the
  // stale cgroup's lock while it removes it, and this sweep then passes it by. It must go, by
  // whichever sweep: a bounded number of tries (CI once saw it still there after one).
  ddprun::cgroup::sweepStaleJobCgroups(own->path());
  for (int i = 0; i < 100 && exists(stale); ++i) {
    ::usleep(10000);
    ddprun::cgroup::sweepStaleJobCgroups(own->path());
  }
  CHECK_FALSE(exists(stale));
  CHECK(exists(held->path()));
  CHECK(exists(populated));
  CHECK(::kill(child, 0) == 0);
  CHECK(exists(other));
  CHECK(exists(own->path()));

  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  killAtEnd.pid = 0;  // reaped: its number may be another process's from now on
  // Its process gone, the unheld one goes at the next sweep; the held one still stays.
  for (int i = 0; i < 1000 && exists(populated); ++i) {
    ddprun::cgroup::sweepStaleJobCgroups(own->path());
    if (exists(populated)) ::usleep(2000);  // the kernel empties it once the child is torn down
  }
  CHECK_FALSE(exists(populated));
  CHECK(exists(held->path()));
  ::rmdir(other.c_str());
  ::rmdir((stale + "/w1").c_str());
  ::rmdir(stale.c_str());
}

TEST_CASE("cgroup sweep: an agent's own job cgroup, held from its mkdir, is never swept", "[supervisor][cgroup]") {
  std::string why;
  auto sweeper = ddprun::JobCgroup::create("ddprun-sweep-sweeper-" + std::to_string(::getpid()), &why);
  if (!sweeper) DDPRUN_SKIP("no job cgroup can be made here: " + why);
  // Agents starting while another's watchdog sweeps: each made cgroup is owned, and stays.
  for (int i = 0; i < 200; ++i) {
    pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      for (int j = 0; j < 50; ++j) ddprun::cgroup::sweepStaleJobCgroups(sweeper->path());
      ::_exit(0);
    }
    auto made = ddprun::JobCgroup::create("ddprun-sweep-race-" + std::to_string(::getpid()) + "-" + std::to_string(i), &why);
    INFO(why);
    REQUIRE(made);
    CHECK(exists(made->path()));
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    CHECK(exists(made->path()));
  }
}
