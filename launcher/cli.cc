#include "launcher/cli.h"

#include <signal.h>

#include <netdb.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <set>
#include <tuple>
#include <cstring>
#include <cstdlib>
#include <iostream>
#include <random>

#include "common/error.h"
#include "common/logging.h"
#include "common/strings.h"
#include "launcher/nproc.h"
#include "launcher/program.h"
#include "common/net.h"

namespace ddprun {
namespace {

// Raw flag values as typed; validated below so that every error names its flag the same way.
struct RawFlags {
  std::string nprocPerNode = "1";
  std::string nnodes = "1";
  std::string nodeRank = "0";
  std::string maxRestarts = "0";
  std::string monitorInterval = "0.1";
  std::string shutdownTimeout = "30";
  std::string hangTimeout = "0";
  std::string masterPort = "29500";
  std::string signalsToHandle = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
  std::string redirects = "0";
  std::string tee = "0";
  std::string localRanksFilter;
  std::string startMethod = "spawn";
  std::string runId;
};

// Both spellings of a torchrun flag, and PET_<NAME> as its default, as torchrun does.
CLI::Option* addFlagOption(CLI::App& app, const std::string& name, std::string& target, const std::string& help,
                           const std::string& shortName = "") {
  std::string dashed = name;
  for (char& c : dashed) c = c == '_' ? '-' : c;
  std::string names = (shortName.empty() ? "" : shortName + ",") + "--" + name;
  if (dashed != name) names += ",--" + dashed;
  std::string env = "PET_";
  for (char c : name) env += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return app.add_option(names, target, help)->envname(env);
}

CLI::Option* addSwitch(CLI::App& app, const std::string& name, bool& target, const std::string& help,
                       const std::string& shortName = "") {
  std::string dashed = name;
  for (char& c : dashed) c = c == '_' ? '-' : c;
  std::string names = (shortName.empty() ? "" : shortName + ",") + "--" + name;
  if (dashed != name) names += ",--" + dashed;
  std::string env = "PET_";
  for (char c : name) env += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return app.add_flag(names, target, help)->envname(env);
}

int parseIntFlag(const std::string& flag, const std::string& value, int64_t min, int64_t max) {
  auto n = parseInt(trim(value));
  if (!n || *n < min || *n > max) {
    throw ConfigError(flag + " '" + value + "': expected an integer from " + std::to_string(min) + " to " +
                      std::to_string(max));
  }
  return static_cast<int>(*n);
}

double parseSecondsFlag(const std::string& flag, const std::string& value) {
  auto s = parseSeconds(trim(value));
  if (!s) throw ConfigError(flag + " '" + value + "': expected a non-negative number of seconds");
  return *s;
}

void parseNnodes(const std::string& value, LaunchConfig& cfg) {
  auto parts = split(value, ':');
  if (parts.size() > 2) throw ConfigError("--nnodes '" + value + "': expected N or MIN:MAX");
  auto min = parseInt(trim(parts[0]));
  auto max = parts.size() == 2 ? parseInt(trim(parts[1])) : min;
  if (!min || !max || *min < 1 || *max < 1 || *max > 100000) {
    throw ConfigError("--nnodes '" + value + "': node counts must be positive integers (N or MIN:MAX)");
  }
  if (*min > *max) throw ConfigError("--nnodes '" + value + "': MIN is larger than MAX");
  cfg.minNodes = static_cast<int>(*min);
  cfg.maxNodes = static_cast<int>(*max);
}

std::vector<int> parseSignals(const std::string& value) {
  std::vector<int> sigs;
  for (const auto& part : split(value, ',')) {
    std::string name(trim(part));
    if (name.empty()) continue;
    std::string bare = startsWith(name, "SIG") ? name.substr(3) : name;
    int sig = 0;
    for (int s = 1; s < NSIG; ++s) {
      const char* abbrev = ::sigabbrev_np(s);
      if (abbrev && bare == abbrev) sig = s;
    }
    if (sig == 0 || sig == SIGKILL || sig == SIGSTOP || sig == SIGCHLD) {
      throw ConfigError("--signals_to_handle '" + value + "': '" + name + "' is not a signal ddprun can handle");
    }
    sigs.push_back(sig);
  }
  return sigs;
}

constexpr int kDefaultRendezvousPort = 29400;

// torchrun's --rdzv_conf keys; the ones that only tune torchrun's own store are accepted and ignored.
void parseRendezvousConf(const std::string& text, LaunchConfig& cfg) {
  static const std::set<std::string> ignored = {"close_timeout", "timeout", "read_timeout", "keep_alive_interval",
                                                "keep_alive_max_attempt", "store_type", "use_libuv"};
  for (const auto& item : split(text, ',')) {
    if (trim(item).empty()) continue;
    auto eq = item.find('=');
    if (eq == std::string::npos) throw ConfigError("--rdzv_conf '" + text + "': expected KEY=VALUE pairs");
    std::string key(trim(item.substr(0, eq)));
    std::string value(trim(item.substr(eq + 1)));
    if (key == "join_timeout") {
      cfg.joinTimeoutSeconds = parseSecondsFlag("--rdzv_conf join_timeout", value);
    } else if (key == "last_call_timeout") {
      cfg.lastCallTimeoutSeconds = parseSecondsFlag("--rdzv_conf last_call_timeout", value);
    } else if (key == "heartbeat_timeout") {
      cfg.heartbeatTimeoutSeconds = parseSecondsFlag("--rdzv_conf heartbeat_timeout", value);
    } else if (key == "is_host") {
      std::string v = value;
      for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (v == "1" || v == "true" || v == "yes") cfg.isHost = true;
      else if (v == "0" || v == "false" || v == "no") cfg.isHost = false;
      else throw ConfigError("--rdzv_conf is_host '" + value + "': expected 1/0, true/false");
    } else if (key == "token_file") {
      if (::access(value.c_str(), R_OK) != 0) throw ConfigError("--rdzv_conf token_file '" + value + "': not readable");
      cfg.tokenFile = value;
    } else if (!ignored.count(key)) {
      throw ConfigError("--rdzv_conf: unknown key '" + key +
                        "' (known: join_timeout, last_call_timeout, heartbeat_timeout, is_host, token_file)");
    }
  }
  if (cfg.joinTimeoutSeconds <= 0 || cfg.heartbeatTimeoutSeconds <= 0) {
    throw ConfigError("--rdzv_conf: join_timeout and heartbeat_timeout must be positive");
  }
}

// Fails fast (exit 2) on an endpoint host that does not resolve, naming it.
void checkResolvable(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* results = nullptr;
  int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &results);
  if (rc != 0) throw ConfigError("rendezvous host '" + host + "' does not resolve: " + ::gai_strerror(rc));
  ::freeaddrinfo(results);
}

// A version-4 UUID, as torchrun's str(uuid.uuid4()).
std::string randomRunId() {
  std::random_device rd;
  std::string hex;
  const char* digits = "0123456789abcdef";
  for (int i = 0; i < 32; ++i) {
    unsigned nibble = rd() & 0xf;
    if (i == 12) nibble = 4;                  // version
    if (i == 16) nibble = 8 | (nibble & 3);   // RFC 4122 variant
    hex += digits[nibble];
    if (i == 7 || i == 11 || i == 15 || i == 19) hex += '-';
  }
  return hex;
}

std::string envOr(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value && *value ? value : fallback;
}

}  // namespace

ParseResult parseCommandLine(int argc, const char* const* argv) {
  ParseResult result;
  LaunchConfig& cfg = result.config;
  RawFlags raw;

  CLI::App app{"ddprun: start one worker process per GPU (or CPU slot) with torchrun's environment, supervise\n"
               "them, restart them on failure, and leave nothing behind.\n\n"
               "Usage: ddprun [OPTIONS] PROGRAM [ARGS...]   (PROGRAM.py and -m MODULE run under $PYTHON_EXEC -u)",
               "ddprun"};
  app.set_version_flag("--version", "ddprun " DDPRUN_VERSION_STRING);
  app.get_formatter()->column_width(40);

  addFlagOption(app, "nproc_per_node", raw.nprocPerNode, "Workers on this node: N (1-1024), auto, cpu or gpu");
  addFlagOption(app, "nnodes", raw.nnodes, "Number of nodes, N or MIN:MAX");
  addFlagOption(app, "node_rank", raw.nodeRank, "Rank of this node (static multi-node)");
  addSwitch(app, "standalone", cfg.standalone, "Single-node job on a local rendezvous with a free port");
  addFlagOption(app, "rdzv_backend", cfg.rdzvBackend, "Rendezvous backend: static, grpc (c10d is an alias)");
  addFlagOption(app, "rdzv_endpoint", cfg.rdzvEndpoint, "Rendezvous endpoint HOST[:PORT]");
  addFlagOption(app, "rdzv_id", raw.runId, "Job id shared by all nodes (TORCHELASTIC_RUN_ID)");
  app.add_option("--run_id,--run-id", raw.runId, "Alias of --rdzv_id")->envname("PET_RUN_ID");
  addFlagOption(app, "rdzv_conf", cfg.rdzvConf, "Rendezvous settings KEY=VALUE,...");
  addFlagOption(app, "master_addr", cfg.masterAddr, "Address of the node of rank 0 (static)");
  addFlagOption(app, "master_port", raw.masterPort, "Port for rank 0's store (static; default 29500)");
  addFlagOption(app, "local_addr", cfg.localAddr, "This node's address, used as MASTER_ADDR when it hosts rank 0");
  addFlagOption(app, "max_restarts", raw.maxRestarts, "Restarts of the worker group before the job fails");
  addFlagOption(app, "monitor_interval", raw.monitorInterval, "Accepted for torchrun compatibility; ddprun is event-driven");
  addFlagOption(app, "start_method", raw.startMethod, "Accepted for torchrun compatibility (spawn, fork, forkserver)");
  addFlagOption(app, "shutdown_timeout", raw.shutdownTimeout, "Seconds between SIGTERM and SIGKILL when stopping workers");
  addFlagOption(app, "hang_timeout", raw.hangTimeout,
                "Seconds without an SDK heartbeat after which a rank counts as hung (0: off)");
  addFlagOption(app, "signals_to_handle", raw.signalsToHandle, "Signals forwarded to the workers");
  addFlagOption(app, "role", cfg.role, "Role name of the workers (ROLE_NAME)");
  addSwitch(app, "module", cfg.module, "PROGRAM is a Python module, run as python -u -m PROGRAM", "-m");
  addSwitch(app, "no_python", cfg.noPython, "Run PROGRAM directly, even if it ends in .py");
  addSwitch(app, "virtual_local_rank", cfg.virtualLocalRank, "LOCAL_RANK=0 and one device per worker in CUDA_VISIBLE_DEVICES");
  addFlagOption(app, "log_dir", cfg.log.logDir, "Keep per-attempt, per-rank stdout/stderr/error files here");
  addFlagOption(app, "redirects", raw.redirects, "Streams sent to files only: 0-3 or LOCAL_RANK:N,...", "-r");
  addFlagOption(app, "tee", raw.tee, "Streams sent to files and the console: 0-3 or LOCAL_RANK:N,...", "-t");
  addFlagOption(app, "local_ranks_filter", raw.localRanksFilter, "Local ranks whose output reaches the console, e.g. 0,1");
  addFlagOption(app, "log_line_prefix_template", cfg.log.prefixTemplate,
                "Console line prefix; fields {rank} {local_rank} {role} {host}");
  app.add_option("--log_level,--log-level", cfg.logLevel, "ddprun's own log level: debug, info, warning, error")
      ->envname("LOGLEVEL");
  app.add_flag("--dry_run,--dry-run", cfg.dryRun, "Print the rank map and each worker's environment; start nothing");
  app.prefix_command();  // PROGRAM and everything after it belong to the program

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    result.kind = ParseResult::Kind::kExit;
    result.exitStatus = app.exit(e);
    return result;
  } catch (const CLI::CallForVersion& e) {
    result.kind = ParseResult::Kind::kExit;
    result.exitStatus = app.exit(e);
    return result;
  } catch (const CLI::ParseError& e) {
    std::cerr << "ddprun: error: " << e.what() << " (see ddprun --help)\n";
    result.kind = ParseResult::Kind::kExit;
    result.exitStatus = 2;
    return result;
  }

  try {
    std::vector<std::string> rest = app.remaining();
    if (!rest.empty() && rest[0] == "--") rest.erase(rest.begin());
    if (!rest.empty() && startsWith(rest[0], "-") && rest[0] != "-") {
      throw ConfigError("unknown option '" + rest[0] + "' (see ddprun --help)");
    }
    if (!rest.empty()) {
      cfg.program = rest[0];
      cfg.programArgs.assign(rest.begin() + 1, rest.end());
    }

    cfg.nprocPerNode = resolveNprocPerNode(std::string(trim(raw.nprocPerNode)), systemDeviceCounts());
    parseNnodes(raw.nnodes, cfg);
    cfg.nodeRank = parseIntFlag("--node_rank", raw.nodeRank, 0, cfg.maxNodes - 1);
    cfg.maxRestarts = parseIntFlag("--max_restarts", raw.maxRestarts, 0, 1000000);
    cfg.monitorIntervalSeconds = parseSecondsFlag("--monitor_interval", raw.monitorInterval);
    cfg.shutdownTimeoutSeconds = parseSecondsFlag("--shutdown_timeout", raw.shutdownTimeout);
    cfg.hangTimeoutSeconds = parseSecondsFlag("--hang_timeout", raw.hangTimeout);
    cfg.masterPort = parseIntFlag("--master_port", raw.masterPort, 1, 65535);
    cfg.masterPortGiven = app.count("--master_port") > 0 || std::getenv("PET_MASTER_PORT") != nullptr;
    cfg.signalsToHandle = parseSignals(raw.signalsToHandle);
    if (raw.startMethod != "spawn" && raw.startMethod != "fork" && raw.startMethod != "forkserver") {
      throw ConfigError("--start_method '" + raw.startMethod + "': expected spawn, fork or forkserver");
    }
    cfg.log.redirects = StreamSpec::parse(raw.redirects, "--redirects");
    cfg.log.tee = StreamSpec::parse(raw.tee, "--tee");
    cfg.log.consoleRanks = LogOptions::parseRankFilter(raw.localRanksFilter);
    validatePrefixTemplate(cfg.log.prefixTemplate);
    setupLogging(cfg.logLevel);

    if (cfg.rdzvBackend == "c10d") cfg.rdzvBackend = "grpc";
    if (cfg.rdzvBackend != "static" && cfg.rdzvBackend != "grpc") {
      throw ConfigError("--rdzv_backend '" + cfg.rdzvBackend + "': expected static, grpc or c10d");
    }
    parseRendezvousConf(cfg.rdzvConf, cfg);
    if (cfg.standalone) {
      // As torchrun: one node, a rendezvous of its own, a fresh id and port.
      cfg.minNodes = cfg.maxNodes = 1;
      cfg.runId = raw.runId.empty() ? randomRunId() : raw.runId;
      if (cfg.localAddr.empty()) cfg.masterAddr = "localhost";
    } else {
      cfg.runId = raw.runId.empty() ? "none" : raw.runId;
    }
    if (!cfg.standalone && (cfg.rdzvBackend == "grpc" || cfg.maxNodes > 1)) {
      cfg.multiNode = true;
      if (cfg.rdzvBackend == "grpc") {
        if (cfg.rdzvEndpoint.empty()) {
          throw ConfigError("--rdzv_backend=" + cfg.rdzvBackend + " needs --rdzv_endpoint HOST[:PORT]");
        }
        std::tie(cfg.endpointHost, cfg.endpointPort) = parseEndpoint(cfg.rdzvEndpoint, kDefaultRendezvousPort);
      } else {
        // Static: node 0 hosts the rendezvous at --master_addr:--master_port, group rank = node rank.
        cfg.endpointHost = cfg.masterAddr;
        cfg.endpointPort = cfg.masterPort;
        cfg.isHost = cfg.nodeRank == 0;
        if (cfg.minNodes != cfg.maxNodes) {
          throw ConfigError("--nnodes " + raw.nnodes + ": an elastic range needs --rdzv_backend=grpc (or c10d)");
        }
      }
      checkResolvable(cfg.endpointHost);
    } else if (!cfg.localAddr.empty()) {
      cfg.masterAddr = cfg.localAddr;
    }

    auto program = resolveProgram(cfg.program, cfg.programArgs, cfg.module, cfg.noPython,
                                  envOr("PYTHON_EXEC", "python3"), envOr("PATH", "/usr/bin:/bin"));
    cfg.executable = program.executable;
    cfg.execArgs = program.args;
  } catch (const ConfigError& e) {
    std::cerr << "ddprun: error: " << e.what() << "\n";
    result.kind = ParseResult::Kind::kExit;
    result.exitStatus = 2;
  }
  return result;
}

}  // namespace ddprun
