// Fuzz target: the whole command line parser, parseCommandLine (launcher/cli.h), with --rdzv_conf,
// --nnodes, --redirects/--tee, --local_ranks_filter, the log prefix template and the program lookup.
// The input split at NUL bytes is argv[1..]. Properties: nothing escapes as an exception; kExit
// carries 0 (help, version) or 2 (bad input); a kRun config holds only validated values.
//
// Hermetic: PET_*, SLURM_* and the other variables the parser reads are cleared once, PATH is fixed, and the
// rendezvous host check resolves through a fake (linked with -Wl,--wrap=getaddrinfo): numeric
// addresses and "localhost" resolve, every other name fails with EAI_NONAME, so no input makes a
// DNS query or waits on one.
#include <netdb.h>
#include <sys/socket.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "common/strings.h"
#include "launcher/cli.h"
#include "tests/fuzz/fuzz_input.h"

extern char** environ;

extern "C" int __real_getaddrinfo(const char* node, const char* service, const addrinfo* hints, addrinfo** res);

extern "C" int __wrap_getaddrinfo(const char* node, const char* service, const addrinfo* hints, addrinfo** res) {
  addrinfo numeric{};
  if (hints) numeric = *hints;
  numeric.ai_flags |= AI_NUMERICHOST;
  if (node && std::strcmp(node, "localhost") == 0) node = "127.0.0.1";
  return __real_getaddrinfo(node, service, &numeric, res);
}

namespace {

void makeHermetic() {
  static const bool done = [] {
    std::vector<std::string> names;
    for (char** e = environ; e && *e; ++e) {
      std::string entry(*e);
      std::string name = entry.substr(0, entry.find('='));
      if (name.rfind("PET_", 0) == 0 || name.rfind("SLURM_", 0) == 0) names.push_back(name);
    }
    for (const auto& name : names) ::unsetenv(name.c_str());
    for (const char* name : {"LOGLEVEL", "PYTHON_EXEC", "CUDA_VISIBLE_DEVICES", "DDPRUN_RDZV_TOKEN"}) {
      ::unsetenv(name);
    }
    ::setenv("PATH", "/usr/bin:/bin", 1);
    if (!std::getenv("DDPRUN_FUZZ_VERBOSE")) {  // the parser's error lines and --help, thousands a second
      std::cout.rdbuf(nullptr);
      std::cerr.rdbuf(nullptr);
    }
    return true;
  }();
  (void)done;
}

// Seconds that the launcher can turn into its integer durations (microseconds, and milliseconds in
// a uint32 for the rendezvous timeouts sent in a Join) without overflow or wrap-around: every
// duration flag has a finite range (launcher/flag_parsing.h), so this always holds now.
bool durationFits(double seconds, double maxSeconds) { return std::isfinite(seconds) && seconds <= maxSeconds; }

void checkConfig(const ddprun::LaunchConfig& cfg) {
  FUZZ_CHECK(cfg.nprocPerNode >= 1 && cfg.nprocPerNode <= 4096, "nproc_per_node " + std::to_string(cfg.nprocPerNode));
  FUZZ_CHECK(cfg.minNodes >= 1 && cfg.minNodes <= cfg.maxNodes && cfg.maxNodes <= 100000, "node counts");
  FUZZ_CHECK(cfg.nodeRank >= 0 && cfg.nodeRank < cfg.maxNodes, "node rank out of range");
  FUZZ_CHECK(cfg.maxRestarts >= 0, "negative max_restarts");
  FUZZ_CHECK(cfg.masterPort >= 1 && cfg.masterPort <= 65535, "master port out of range");
  for (double s : {cfg.joinTimeoutSeconds, cfg.heartbeatTimeoutSeconds}) FUZZ_CHECK(s > 0, "a timeout is not positive");
  for (double s : {cfg.lastCallTimeoutSeconds, cfg.monitorIntervalSeconds, cfg.shutdownTimeoutSeconds,
                   cfg.hangTimeoutSeconds}) {
    FUZZ_CHECK(s >= 0 && std::isfinite(s), "a duration is negative or not finite");
  }
  FUZZ_CHECK(!cfg.program.empty() && !cfg.executable.empty() && cfg.executable[0] == '/',
             "no program, or an executable that is not an absolute path");
  FUZZ_CHECK(!cfg.runId.empty(), "empty run id");
  if (cfg.multiNode) {
    FUZZ_CHECK(!cfg.endpointHost.empty(), "multi-node without an endpoint host");
    FUZZ_CHECK(cfg.endpointPort >= 0 && cfg.endpointPort <= 65535, "endpoint port out of range");
  }
  {
    const double maxMillis32 = std::numeric_limits<uint32_t>::max() / 1000.0;  // Join's *_timeout_ms
    const double maxMicros64 = 9.2e12;                                          // int64 microseconds
    FUZZ_CHECK(durationFits(cfg.joinTimeoutSeconds, maxMillis32) &&
                   durationFits(cfg.lastCallTimeoutSeconds, maxMillis32) &&
                   durationFits(cfg.heartbeatTimeoutSeconds, maxMillis32),
               "a rendezvous timeout does not fit the Join's uint32 milliseconds (it would wrap around)");
    FUZZ_CHECK(durationFits(cfg.shutdownTimeoutSeconds, maxMicros64) &&
                   durationFits(cfg.hangTimeoutSeconds, maxMicros64),
               "a duration overflows int64 when converted (undefined behaviour in launch.cc)");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  makeHermetic();
  std::vector<std::string> args = {"ddprun"};
  std::string current;
  for (std::size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      args.push_back(current);
      current.clear();
    } else {
      current += static_cast<char>(data[i]);
    }
  }
  if (size > 0) args.push_back(current);
  if (args.size() > 256) return -1;  // not worth keeping: argv is not where the parser's logic is
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  argv.push_back(nullptr);

  ddprun::ParseResult result;
  try {
    result = ddprun::parseCommandLine(static_cast<int>(args.size()), argv.data());
  } catch (const std::exception& e) {
    ddprun::fuzz::fail(__FILE__, __LINE__, std::string("parseCommandLine threw: ") + ddprun::printable(e.what(), 512));
  } catch (...) {
    ddprun::fuzz::fail(__FILE__, __LINE__, "parseCommandLine threw a non-standard exception");
  }
  if (result.kind == ddprun::ParseResult::Kind::kExit) {
    FUZZ_CHECK(result.exitStatus == 0 || result.exitStatus == 2,
               "exit status " + std::to_string(result.exitStatus) + " (expected 0 or 2)");
  } else {
    checkConfig(result.config);
  }
  return 0;
}
