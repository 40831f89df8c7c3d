// PosixProcessSupervisor with real processes: the CPU affinity of --numa_binding is set in the
// child before exec (the worker's first instruction already runs on its CPUs), and a request
// without CPUs inherits the agent's; a worker starts in the job's cgroup, by clone3 and by the
// vfork fallback alike; a program that cannot be executed is one clear error, not a child.
#include "agent/posix_process_supervisor.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <optional>

#include "agent/job_cgroup.h"
#include "common/error.h"
#include "launcher/numa_binding.h"
#include "test_skip.h"
#include "test_util.h"

namespace {

// Runs `command` under /bin/sh with `cpus`; returns what it wrote to the file named by $OUT.
std::string runAndRead(const std::vector<int>& cpus, const std::string& command = "grep Cpus_allowed_list /proc/self/status | cut -f2",
                       ddprun::SpawnMethod method = ddprun::SpawnMethod::kAuto) {
  ddprun::test::TempDir dir;
  boost::asio::io_context io;
  ddprun::PosixProcessSupervisorOptions options;
  options.spawnMethod = method;
  ddprun::PosixProcessSupervisor supervisor(io, options);
  std::optional<ddprun::ProcessExit> exited;
  supervisor.setExitHandler([&](const ddprun::ProcessExit& e) { exited = e; });
  ddprun::SpawnRequest request;
  request.executable = "/bin/sh";
  request.args = {"-c", command + " > " + dir.file("out")};
  request.env.set("PATH", "/usr/bin:/bin");
  request.cpus = cpus;
  supervisor.spawn(request);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);  // safety bound
  while (!exited && std::chrono::steady_clock::now() < deadline) io.run_for(std::chrono::milliseconds(50));
  REQUIRE(exited.has_value());
  REQUIRE(exited->exitCode == 0);
  std::string text = ddprun::test::readFile(dir.file("out"));
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

}  // namespace

TEST_CASE("supervisor: a worker starts on the CPUs its request names, else on the agent's", "[supervisor]") {
  std::set<int> allowed = ddprun::allowedCpus();
  REQUIRE_FALSE(allowed.empty());
  const int last = *allowed.rbegin();
  CHECK(runAndRead({last}) == std::to_string(last));
  if (allowed.size() > 1) {
    const int first = *allowed.begin();
    CHECK(runAndRead({first, last}) == std::to_string(first) + (last == first + 1 ? "-" : ",") + std::to_string(last));
  }
  // No CPUs named: the agent's own affinity, all of it.
  std::set<int> inherited = ddprun::parseCpuList(runAndRead({}));
  CHECK(inherited == allowed);
}

namespace {

// Whether this process may make a job cgroup here (root, or a delegated cgroup v2 subtree).
bool canMakeJobCgroup(std::string* why) {
  return ddprun::JobCgroup::create("ddprun-probe-" + std::to_string(::getpid()), why) != nullptr;
}

}  // namespace

TEST_CASE("supervisor: a worker starts in the job's cgroup (clone3 into it)", "[supervisor]") {
  std::string why;
  if (!canMakeJobCgroup(&why)) DDPRUN_SKIP("no job cgroup can be made here: " + why);
  // The first line the worker runs already sees the job cgroup ("0::/.../ddprun-<hex>").
  std::string cgroup = runAndRead({}, "grep ^0:: /proc/self/cgroup");
  CHECK(cgroup.find("/ddprun-") != std::string::npos);
}

TEST_CASE("supervisor: the vfork fallback moves a worker into the job's cgroup too", "[supervisor]") {
  std::string why;
  if (!canMakeJobCgroup(&why)) DDPRUN_SKIP("no job cgroup can be made here: " + why);
  std::string cgroup = runAndRead({}, "grep ^0:: /proc/self/cgroup", ddprun::SpawnMethod::kVfork);
  CHECK(cgroup.find("/ddprun-") != std::string::npos);
}

TEST_CASE("supervisor: a worker gets default signal handling and no blocked signal, by either method", "[supervisor]") {
  // The agent ignores SIGPIPE and blocks every signal around the clone; the worker must start with
  // neither (grep reads its own status: what the worker passed on).
  for (auto method : {ddprun::SpawnMethod::kAuto, ddprun::SpawnMethod::kVfork}) {
    std::string status = runAndRead({}, "grep -E '^Sig(Blk|Ign|Cgt)' /proc/self/status | tr '\\n' ' '", method);
    INFO(status);
    CHECK(status.find("SigBlk:\t0000000000000000") != std::string::npos);
    // /bin/sh itself ignores nothing by default; SIGPIPE (bit 13) must not be ignored.
    auto at = status.find("SigIgn:\t");
    REQUIRE(at != std::string::npos);
    unsigned long long ignored = std::stoull(status.substr(at + 8, 16), nullptr, 16);
    CHECK((ignored & (1ULL << (SIGPIPE - 1))) == 0);
  }
}

TEST_CASE("supervisor: a program that cannot be executed is an error that names it, by either method", "[supervisor]") {
  for (auto method : {ddprun::SpawnMethod::kAuto, ddprun::SpawnMethod::kVfork}) {
    boost::asio::io_context io;
    ddprun::PosixProcessSupervisorOptions options;
    options.spawnMethod = method;
    ddprun::PosixProcessSupervisor supervisor(io, options);
    int exits = 0;
    supervisor.setExitHandler([&](const ddprun::ProcessExit&) { ++exits; });
    ddprun::SpawnRequest request;
    request.executable = "/nonexistent/ddprun-no-such-program";
    try {
      supervisor.spawn(request);
      FAIL("spawn of a missing program did not throw");
    } catch (const ddprun::Error& e) {
      CHECK(std::string(e.what()) == "cannot start /nonexistent/ddprun-no-such-program: No such file or directory");
    }
    io.run_for(std::chrono::milliseconds(50));
    CHECK(exits == 0);  // the failed child was reaped by spawn, never reported as a worker
    errno = 0;
    CHECK(::waitpid(-1, nullptr, WNOHANG) == -1);  // and no zombie is left
    CHECK(errno == ECHILD);
  }
}

TEST_CASE("supervisor: workers started after the job cgroup was killed run (a restart)", "[supervisor]") {
  // Linux SIGKILLs a child cloned into a cgroup that cgroup.kill ever hit; a restart follows the
  // sweep of the failed attempt, which kills the job cgroup.
  std::string why;
  if (!canMakeJobCgroup(&why)) DDPRUN_SKIP("no job cgroup can be made here: " + why);
  boost::asio::io_context io;
  ddprun::PosixProcessSupervisor supervisor(io, ddprun::PosixProcessSupervisorOptions{});
  std::vector<ddprun::ProcessExit> exits;
  supervisor.setExitHandler([&](const ddprun::ProcessExit& e) { exits.push_back(e); });
  auto runOne = [&] {
    ddprun::SpawnRequest request;
    request.executable = "/bin/sh";
    request.args = {"-c", "exit 0"};
    pid_t pid = supervisor.spawn(request);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);  // safety bound
    while (exits.empty() && std::chrono::steady_clock::now() < deadline) io.run_for(std::chrono::milliseconds(20));
    REQUIRE(exits.size() == 1);
    ddprun::ProcessExit e = exits.front();
    exits.clear();
    supervisor.sweepOrphans({pid});  // kills the job cgroup: nothing of the attempt may outlive it
    return e;
  };
  for (int attempt = 0; attempt < 3; ++attempt) {
    INFO("attempt " << attempt);
    ddprun::ProcessExit e = runOne();
    CHECK(e.signal == 0);
    CHECK(e.exitCode == 0);
  }
}

TEST_CASE("spawnWorker: clone3 starts the child in the cgroup with no cgroup.procs to write", "[supervisor]") {
  std::string why;
  auto cgroup = ddprun::JobCgroup::create("ddprun-spawn-test-" + std::to_string(::getpid()), &why);
  if (!cgroup) DDPRUN_SKIP("no job cgroup can be made here: " + why);
#if !defined(__x86_64__)
  DDPRUN_SKIP("clone3 with a child stack is built for x86-64 only; elsewhere workers move in by cgroup.procs");
#else
  ddprun::test::TempDir dir;
  const std::string out = dir.file("cgroup");
  std::string script = "grep ^0:: /proc/self/cgroup > " + out;
  char sh[] = "/bin/sh", c[] = "-c";
  char* argv[] = {sh, c, script.data(), nullptr};
  char path[] = "PATH=/usr/bin:/bin";
  char* envp[] = {path, nullptr};
  ddprun::WorkerSpawnSpec spec;
  spec.path = "/bin/sh";
  spec.argv = argv;
  spec.envp = envp;
  spec.cgroupDirFd = cgroup->spawnDirFd();
  spec.cgroupProcsFd = -1;  // the fallback could not move it: only clone3 puts it there
  bool refused = false;
  ddprun::SpawnResult result = ddprun::spawnWorker(spec, ddprun::SpawnMethod::kAuto, &refused);
  REQUIRE(result.pid > 0);
  int status = 0;
  REQUIRE(::waitpid(result.pid, &status, 0) == result.pid);
  CHECK(WIFEXITED(status));
  CHECK_FALSE(refused);
  CHECK(result.cloned);
  CHECK(ddprun::test::readFile(out).find("/" + cgroup->path().substr(cgroup->path().rfind('/') + 1)) != std::string::npos);
#endif
}
