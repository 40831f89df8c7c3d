// PosixProcessSupervisor with real processes: the CPU affinity of --numa_binding is set in the
// child before exec (the worker's first instruction already runs on its CPUs), and a request
// without CPUs inherits the agent's.
#include "agent/posix_process_supervisor.h"

#include <catch2/catch.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <optional>

#include "launcher/numa_binding.h"
#include "test_util.h"

namespace {

// Runs `script` under /bin/sh with `cpus`, returns what it wrote to its output file.
std::string runAndRead(const std::vector<int>& cpus) {
  ddprun::test::TempDir dir;
  boost::asio::io_context io;
  ddprun::PosixProcessSupervisor supervisor(io, ddprun::PosixProcessSupervisorOptions{});
  std::optional<ddprun::ProcessExit> exited;
  supervisor.setExitHandler([&](const ddprun::ProcessExit& e) { exited = e; });
  ddprun::SpawnRequest request;
  request.executable = "/bin/sh";
  request.args = {"-c", "grep Cpus_allowed_list /proc/self/status | cut -f2 > " + dir.file("out")};
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
