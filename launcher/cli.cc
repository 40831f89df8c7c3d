#include "launcher/cli.h"

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "common/error.h"
#include "common/logging.h"
#include "common/net.h"
#include "common/strings.h"
#include "agent/filtered_log.h"
#include "launcher/flag_parsing.h"
#include "launcher/flag_table.h"
#include "launcher/nproc.h"
#include "launcher/numa_binding.h"
#include "launcher/program.h"
#include "launcher/rendezvous_setup.h"
#include "launcher/scheduler/slurm_env.h"
#include "launcher/scheduler/slurm_node_addr.h"

namespace ddprun {
namespace {

std::string envOr(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value && *value ? value : fallback;
}

// --numa_binding on this machine: the GPUs' NUMA nodes from the driver, the CPUs from sysfs.
std::vector<std::vector<int>> bindToNuma(const std::string& mode, int nproc) {
  SysfsTopology topology;
  std::vector<int> nodes;
  for (const auto& busId : cudaPciBusIds()) nodes.push_back(topology.pciNumaNode(busId));
  std::vector<std::vector<int>> cpus;
  try {
    for (const auto& set : numaBindings(mode, nodes, nproc, topology, allowedCpus())) cpus.emplace_back(set.begin(), set.end());
  } catch (const ConfigError&) {
    throw;
  } catch (const Error& e) {
    throw ConfigError("--numa_binding=" + mode + ": cannot read the CPU topology: " + e.what());
  }
  return cpus;
}

// How long `scontrol show node` may take (it asks slurmctld) before a name is left unresolved.
constexpr std::chrono::seconds kScontrolTimeout{10};

bool resolves(const std::string& host) {
  try {
    checkResolvable(host);
    return true;
  } catch (const ConfigError&) {
    return false;
  }
}

// What a Slurm step supplies: flag values for the flags not given, and the step for --dry_run.
struct SlurmDefaults {
  std::map<std::string, std::string, std::less<>> values;
  std::optional<SlurmStep> step;
};

// Inside an srun step, every flag not given comes from the step (issue #13); --no_slurm, and
// --standalone (one node with a rendezvous of its own, by request), leave Slurm alone.
SlurmDefaults slurmDefaults(const CLI::App& app, const FlagValues& flags, int argc, const char* const* argv) {
  SlurmDefaults slurm;
  if (flags.isOn("no_slurm") || flags.isOn("standalone")) return slurm;
  EnvLookup env = [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    return value ? std::optional<std::string>(value) : std::nullopt;
  };
  slurm.step = readSlurmStep(env, std::vector<std::string>(argv, argv + argc));
  if (!slurm.step) return slurm;
  slurm.values = slurmFlagValues(*slurm.step, [&](std::string_view name) -> std::optional<std::string> {
    bool given = flagGiven(app, name) || (name == "rdzv_id" && flagGiven(app, "run_id"));
    return given ? std::optional<std::string>(flags.text(name)) : std::nullopt;
  });
  // Slurm may be alone in knowing a node's name: where the first host does not resolve, its
  // NodeAddr (scontrol show node) takes its place; without one, the later check says so.
  if (auto host = slurm.values.find("master_addr"); host != slurm.values.end() && !resolves(host->second)) {
    if (auto addr = querySlurmNodeAddr(host->second, kScontrolTimeout)) {
      host->second = *addr;
      if (auto endpoint = slurm.values.find("rdzv_endpoint"); endpoint != slurm.values.end()) {
        endpoint->second = joinHostPort(*addr, slurm.step->port());
      }
    }
  }
  return slurm;
}

// The LaunchConfig from the parsed flags. The order of the checks decides which error a command
// line with several mistakes reports; it is kept as users have seen it.
LaunchConfig buildConfig(const CLI::App& app, const FlagValues& flags, const SlurmDefaults& slurm) {
  auto text = [&](std::string_view name) {
    auto supplied = slurm.values.find(name);
    return parseText("--" + std::string(name), supplied != slurm.values.end() ? supplied->second : flags.text(name));
  };
  LaunchConfig cfg;
  if (slurm.step) {
    cfg.slurmHosts = slurm.step->hosts;
    cfg.slurmStep = slurm.step->describe();
  }
  std::vector<std::string> rest = app.remaining();
  if (!rest.empty() && rest[0] == "--") rest.erase(rest.begin());
  if (!rest.empty() && startsWith(rest[0], "-") && rest[0] != "-") {
    throw ConfigError("unknown option '" + rest[0] + "' (see ddprun --help)");
  }
  if (!rest.empty()) {
    cfg.program = rest[0];
    cfg.programArgs.assign(rest.begin() + 1, rest.end());
  }

  cfg.nprocPerNode = resolveNprocPerNode(std::string(trim(text("nproc_per_node"))), systemDeviceCounts());
  NodeRange nodes = parseNnodes(text("nnodes"));
  cfg.minNodes = nodes.min;
  cfg.maxNodes = nodes.max;
  cfg.nodeRank = parseNodeRank(text("node_rank"), cfg.maxNodes);
  cfg.maxRestarts = parseIntFlag("--max_restarts", text("max_restarts"), kMaxRestartsRange);
  cfg.monitorIntervalSeconds = parseSecondsFlag("--monitor_interval", text("monitor_interval"), kMonitorIntervalRange);
  // torchrun's variables for two settings it has no PET_ default for, used when the flag is not given.
  const char* torchShutdown = std::getenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT");
  const bool shutdownFromTorch = !flagGiven(app, "shutdown_timeout") && torchShutdown && *torchShutdown;
  cfg.shutdownTimeoutSeconds = parseSecondsFlag(shutdownFromTorch ? "TORCH_ELASTIC_SHUTDOWN_TIMEOUT" : "--shutdown_timeout",
                                                shutdownFromTorch ? torchShutdown : text("shutdown_timeout"),
                                                kShutdownTimeoutRange);
  cfg.hangTimeoutAuto = text("hang_timeout") == "auto";
  if (!cfg.hangTimeoutAuto) {
    cfg.hangTimeoutSeconds = parseSecondsFlag("--hang_timeout", text("hang_timeout"), kHangTimeoutRange);
  }
  cfg.finishTimeoutSeconds = parseSecondsFlag("--finish_timeout", text("finish_timeout"), kFinishTimeoutRange);
  cfg.excludeNodeAfter = parseIntFlag("--exclude_node_after", text("exclude_node_after"), kMaxRestartsRange);
  cfg.stopWithoutProgress = parseIntFlag("--stop_without_progress", text("stop_without_progress"), kMaxRestartsRange);
  cfg.masterPort = parseIntFlag("--master_port", text("master_port"), kMasterPortRange);
  // A Slurm step's port counts as given: the same on every node, apart for steps side by side.
  cfg.masterPortGiven = flagGiven(app, "master_port") || slurm.values.count("master_port") > 0;
  cfg.torchStore = parseTorchStore(text("torch_store"));
  cfg.recoverInProcess = parseRecovery(text("recovery"));
  cfg.sparesPerNode = parseIntFlag("--spares_per_node", text("spares_per_node"), IntRange{0, 64});
  if (cfg.sparesPerNode > 0 && !cfg.recoverInProcess) {
    throw ConfigError("--spares_per_node needs --recovery=in_process (only an in-process recovery uses a spare)");
  }
  cfg.signalsToHandle = parseSignals(text("signals_to_handle"));
  cfg.signalsToHandleText = std::string(trim(text("signals_to_handle")));
  checkStartMethod(text("start_method"));
  cfg.log.redirects = StreamSpec::parse(text("redirects"), "--redirects");
  cfg.log.tee = StreamSpec::parse(text("tee"), "--tee");
  cfg.log.consoleRanks = LogOptions::parseRankFilter(text("local_ranks_filter"));
  cfg.log.prefixTemplate = text("log_line_prefix_template");
  if (const char* torchTemplate = std::getenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE");
      torchTemplate && !flagGiven(app, "log_line_prefix_template")) {
    cfg.log.prefixTemplate = torchTemplate;
  }
  validatePrefixTemplate(cfg.log.prefixTemplate);
  cfg.log.logDir = text("log_dir");
  cfg.log.duplicateStdoutFilters = FilteredLog::parseList(text("duplicate_stdout_filters"));
  cfg.log.duplicateStderrFilters = FilteredLog::parseList(text("duplicate_stderr_filters"));
  checkLogsSpecs(text("logs_specs"));
  cfg.eventLogHandler = parseEventLogHandler(text("event_log_handler"));
  cfg.timeline = text("timeline");
  if (!text("metrics_port").empty()) {
    cfg.metrics.port = parseIntFlag("--metrics_port", text("metrics_port"), IntRange{0, 65535});
  }
  cfg.metrics.bindAddress = text("metrics_bind");
  cfg.numaBinding = parseNumaBinding(text("numa_binding"));
  cfg.logLevel = text("log_level");
  setupLogging(cfg.logLevel);

  cfg.rdzvBackend = parseRdzvBackend(text("rdzv_backend"));
  cfg.rdzvConf = text("rdzv_conf");
  for (const auto& warning : parseRendezvousConf(cfg.rdzvConf, cfg)) spdlog::warn("{}", warning);
  cfg.standalone = flags.isOn("standalone");
  cfg.rdzvEndpoint = text("rdzv_endpoint");
  cfg.masterAddr = text("master_addr");
  cfg.localAddr = text("local_addr");
  decideRendezvous(cfg, RendezvousFlags{text("rdzv_id"), text("nnodes"), randomRunId});
  if (cfg.multiNode) checkResolvable(cfg.endpointHost);
  if (cfg.recoverInProcess && !cfg.agentTorchStore()) {
    throw ConfigError("--recovery=in_process needs torch's store served by ddprun (it must outlive rank 0): "
                      "drop --torch_store=rank0");
  }

  cfg.role = text("role");
  cfg.virtualLocalRank = flags.isOn("virtual_local_rank");
  cfg.dryRun = flags.isOn("dry_run");
  cfg.module = flags.isOn("module");
  cfg.noPython = flags.isOn("no_python");
  if (!cfg.numaBinding.empty()) cfg.workerCpus = bindToNuma(cfg.numaBinding, cfg.nprocPerNode);
  cfg.runPath = flags.isOn("run_path");
  auto program = resolveProgram(cfg.program, cfg.programArgs, cfg.module, cfg.noPython,
                                envOr("PYTHON_EXEC", "python3"), envOr("PATH", "/usr/bin:/bin"), cfg.runPath);
  cfg.executable = program.executable;
  cfg.execArgs = program.args;
  cfg.localRankArg = parseLegacyLocalRank(text("legacy_local_rank"));
  cfg.localRankArgAt = cfg.execArgs.size() - cfg.programArgs.size();  // after the script, before its args
  return cfg;
}

ParseResult exitWith(int status) {
  ParseResult result;
  result.kind = ParseResult::Kind::kExit;
  result.exitStatus = status;
  return result;
}

}  // namespace

ParseResult parseCommandLine(int argc, const char* const* argv, const VersionText& versionText) {
  CLI::App app{"ddprun: start one worker process per GPU (or CPU slot) with torchrun's environment, supervise\n"
               "them, restart them on failure, and leave nothing behind.\n\n"
               "Usage: ddprun [OPTIONS] PROGRAM [ARGS...]   (PROGRAM.py and -m MODULE run under $PYTHON_EXEC -u)",
               "ddprun"};
  app.set_version_flag("--version", versionText ? versionText : VersionText([] { return std::string("ddprun"); }));
  app.get_formatter()->column_width(40);
  FlagValues flags;
  registerFlags(app, flags);
  app.prefix_command();  // PROGRAM and everything after it belong to the program

  ExpandedArgs expanded = expandAbbreviations(argc, argv);
  if (expanded.error) {
    std::cerr << "ddprun: error: " << printable(*expanded.error, 400) << " (see ddprun --help)\n";
    return exitWith(2);
  }
  std::vector<const char*> words{argc > 0 ? argv[0] : "ddprun"};
  for (const auto& word : expanded.args) words.push_back(word.c_str());
  const int count = static_cast<int>(words.size());
  if (auto problem = flagTakenAsValue(count, words.data())) {
    std::cerr << "ddprun: error: " << printable(*problem, 400) << "\n";
    return exitWith(2);
  }
  try {
    app.parse(count, words.data());
  } catch (const CLI::CallForHelp& e) {
    return exitWith(app.exit(e));
  } catch (const CLI::CallForVersion& e) {
    return exitWith(app.exit(e));
  } catch (const CLI::ParseError& e) {
    std::cerr << "ddprun: error: " << oneLine(e.what()) << " (see ddprun --help)\n";
    return exitWith(2);
  }

  try {
    if (const std::string& shell = flags.text("print_completion"); !shell.empty()) {
      std::cout << completionScript(shell);
      return exitWith(0);
    }
    ParseResult result;
    result.config = buildConfig(app, flags, slurmDefaults(app, flags, argc, argv));
    return result;
  } catch (const ConfigError& e) {
    // One line whatever the message quotes: a value with a newline must not forge a second one.
    std::cerr << "ddprun: error: " << oneLine(e.what()) << "\n";
    return exitWith(2);
  }
}

}  // namespace ddprun
