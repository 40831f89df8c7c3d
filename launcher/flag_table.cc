#include "launcher/flag_table.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>

#include "common/error.h"

namespace ddprun {
namespace {

using enum FlagKind;

// Defaults are torchrun's; the PET_<NAME> variables are how torchrun takes defaults from the
// environment. --log_level reads LOGLEVEL as torchrun's logging does; --dry_run and --no_slurm are
// ddprun's own.
constexpr FlagSpec kFlags[] = {
    {"nproc_per_node", "", "PET_NPROC_PER_NODE", "1", kOption, "Workers on this node: N (1-1024), auto, cpu or gpu"},
    {"nnodes", "", "PET_NNODES", "1", kOption, "Number of nodes, N or MIN:MAX"},
    {"node_rank", "", "PET_NODE_RANK", "0", kOption, "Rank of this node (static multi-node)"},
    {"standalone", "", "PET_STANDALONE", "", kSwitch, "Single-node job on a local rendezvous with a free port"},
    {"rdzv_backend", "", "PET_RDZV_BACKEND", "static", kOption, "Rendezvous backend: static, grpc (c10d is an alias)"},
    {"rdzv_endpoint", "", "PET_RDZV_ENDPOINT", "", kOption, "Rendezvous endpoint HOST[:PORT]"},
    {"rdzv_id", "", "PET_RDZV_ID", "", kOption, "Job id shared by all nodes (TORCHELASTIC_RUN_ID)"},
    {"run_id", "", "PET_RUN_ID", "", kOption, "Alias of --rdzv_id", "rdzv_id"},
    {"rdzv_conf", "", "PET_RDZV_CONF", "", kOption, "Rendezvous settings KEY=VALUE,..."},
    {"master_addr", "", "PET_MASTER_ADDR", "127.0.0.1", kOption, "Address of the node of rank 0 (static)"},
    {"master_port", "", "PET_MASTER_PORT", "29500", kOption, "Port for rank 0's store (static; default 29500)"},
    {"local_addr", "", "PET_LOCAL_ADDR", "", kOption,
     "This node's address, used as MASTER_ADDR when it hosts rank 0"},
    {"max_restarts", "", "PET_MAX_RESTARTS", "0", kOption, "Restarts of the worker group before the job fails"},
    {"monitor_interval", "", "PET_MONITOR_INTERVAL", "0.1", kOption,
     "Accepted for torchrun compatibility; ddprun is event-driven"},
    {"start_method", "", "PET_START_METHOD", "spawn", kOption,
     "Accepted for torchrun compatibility (spawn, fork, forkserver)"},
    {"shutdown_timeout", "", "PET_SHUTDOWN_TIMEOUT", "30", kOption,
     "Seconds between SIGTERM and SIGKILL when stopping workers"},
    {"hang_timeout", "", "PET_HANG_TIMEOUT", "0", kOption,
     "Seconds without an SDK heartbeat after which a rank counts as hung (0: off)"},
    {"signals_to_handle", "", "PET_SIGNALS_TO_HANDLE", "SIGTERM,SIGINT,SIGHUP,SIGQUIT", kOption,
     "Signals forwarded to the workers"},
    {"role", "", "PET_ROLE", "default", kOption, "Role name of the workers (ROLE_NAME)"},
    {"module", "-m", "PET_MODULE", "", kSwitch, "PROGRAM is a Python module, run as python -u -m PROGRAM"},
    {"no_python", "", "PET_NO_PYTHON", "", kSwitch, "Run PROGRAM directly, even if it ends in .py"},
    {"virtual_local_rank", "", "PET_VIRTUAL_LOCAL_RANK", "", kSwitch,
     "LOCAL_RANK=0 and one device per worker in CUDA_VISIBLE_DEVICES"},
    {"log_dir", "", "PET_LOG_DIR", "", kOption, "Keep per-attempt, per-rank stdout/stderr/error files here"},
    {"redirects", "-r", "PET_REDIRECTS", "0", kOption, "Streams sent to files only: 0-3 or LOCAL_RANK:N,..."},
    {"tee", "-t", "PET_TEE", "0", kOption, "Streams sent to files and the console: 0-3 or LOCAL_RANK:N,..."},
    {"local_ranks_filter", "", "PET_LOCAL_RANKS_FILTER", "", kOption,
     "Local ranks whose output reaches the console, e.g. 0,1"},
    {"log_line_prefix_template", "", "PET_LOG_LINE_PREFIX_TEMPLATE", "[{role}{local_rank}]:", kOption,
     "Console line prefix; fields {rank} {local_rank} {role} {host}"},
    {"log_level", "", "LOGLEVEL", "warning", kOption, "ddprun's own log level: debug, info, warning, error"},
    {"dry_run", "", "", "", kSwitch, "Print the rank map and each worker's environment; start nothing"},
    {"no_slurm", "", "PET_NO_SLURM", "", kSwitch, "Inside a Slurm step, take nothing from it (see README: Slurm)"},
};

const FlagSpec& findFlag(std::string_view name) {
  auto it = std::find_if(std::begin(kFlags), std::end(kFlags), [&](const FlagSpec& f) { return f.name == name; });
  DDPRUN_CHECK(it != std::end(kFlags), "no flag named " + std::string(name));
  return *it;
}

}  // namespace

std::span<const FlagSpec> flagTable() { return kFlags; }

std::string flagSpellings(const FlagSpec& flag) {
  std::string dashed(flag.name);
  std::replace(dashed.begin(), dashed.end(), '_', '-');
  std::string names = (flag.shortName.empty() ? "" : std::string(flag.shortName) + ",") + "--" + std::string(flag.name);
  if (dashed != flag.name) names += ",--" + dashed;
  return names;
}

const std::string& FlagValues::text(std::string_view name) const {
  auto it = texts_.find(name);
  DDPRUN_CHECK(it != texts_.end(), "no option named " + std::string(name));
  return it->second;
}

bool FlagValues::isOn(std::string_view name) const {
  auto it = switches_.find(name);
  DDPRUN_CHECK(it != switches_.end(), "no switch named " + std::string(name));
  return it->second;
}

void registerFlags(CLI::App& app, FlagValues& values) {
  // Defaults first, so that an alias finds the value it shares whatever the row order.
  for (const FlagSpec& flag : kFlags) {
    if (flag.kind == kSwitch) values.switches_[std::string(flag.name)] = false;
    else if (flag.aliasOf.empty()) values.texts_[std::string(flag.name)] = flag.defaultValue;
  }
  for (const FlagSpec& flag : kFlags) {
    const std::string help(flag.help);
    CLI::Option* option = nullptr;
    if (flag.kind == kSwitch) {
      option = app.add_flag(flagSpellings(flag), values.switches_.at(std::string(flag.name)), help);
    } else {
      std::string_view target = flag.aliasOf.empty() ? flag.name : flag.aliasOf;
      option = app.add_option(flagSpellings(flag), values.texts_.at(std::string(target)), help);
    }
    if (!flag.envName.empty()) option->envname(std::string(flag.envName));
  }
}

bool flagGiven(const CLI::App& app, std::string_view name) {
  const FlagSpec& flag = findFlag(name);
  const std::string env(flag.envName);
  return app.count("--" + std::string(flag.name)) > 0 || (!env.empty() && std::getenv(env.c_str()) != nullptr);
}

std::optional<std::string> flagTakenAsValue(int argc, const char* const* argv) {
  auto optionNamed = [](std::string_view word) -> const FlagSpec* {
    for (const FlagSpec& flag : flagTable()) {
      if (!flag.shortName.empty() && word == flag.shortName) return &flag;
      if (!word.starts_with("--")) continue;
      std::string_view bare = word.substr(2);
      if (bare.size() != flag.name.size()) continue;
      bool same = true;  // '_' and '-' are the same letter here, as in the two spellings
      for (std::size_t i = 0; i < bare.size() && same; ++i) {
        char a = bare[i] == '-' ? '_' : bare[i];
        char b = flag.name[i] == '-' ? '_' : flag.name[i];
        same = a == b;
      }
      if (same) return &flag;
    }
    return nullptr;
  };
  for (int i = 1; i < argc; ++i) {
    std::string_view word = argv[i];
    if (word == "--" || !word.starts_with("-") || word == "-") return std::nullopt;  // the program
    const FlagSpec* flag = optionNamed(word);
    if (!flag || flag->kind == FlagKind::kSwitch) continue;
    if (i + 1 >= argc) return std::nullopt;  // CLI11 reports the missing value
    std::string_view value = argv[i + 1];
    if (value.starts_with("--")) {
      return std::string(word) + " needs a value, and '" + std::string(value.substr(0, 64)) +
             "' is a flag (write " + std::string(word) + "=" + std::string(value.substr(0, 64)) +
             " if it really is the value)";
    }
    ++i;  // the option's value
  }
  return std::nullopt;
}

}  // namespace ddprun
