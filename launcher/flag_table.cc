#include "launcher/flag_table.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>

#include "common/error.h"
#include "common/strings.h"

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
    {"rdzv_backend", "", "PET_RDZV_BACKEND", "static", kOption, "Rendezvous backend: static, grpc (c10d is an alias), etcd (etcd-v2 is an alias)"},
    {"rdzv_endpoint", "", "PET_RDZV_ENDPOINT", "", kOption, "Rendezvous endpoint HOST[:PORT]"},
    {"rdzv_id", "", "PET_RDZV_ID", "", kOption, "Job id shared by all nodes (TORCHELASTIC_RUN_ID)"},
    {"run_id", "", "PET_RUN_ID", "", kOption, "Alias of --rdzv_id", "rdzv_id"},
    {"rdzv_conf", "", "PET_RDZV_CONF", "", kOption, "Rendezvous settings KEY=VALUE,..."},
    {"master_addr", "", "PET_MASTER_ADDR", "127.0.0.1", kOption, "Address of the node of rank 0 (static)"},
    {"master_port", "", "PET_MASTER_PORT", "29500", kOption,
     "Port of torch's store (single node; default: a free one) or of the static rendezvous (node 0)"},
    {"recovery", "", "PET_RECOVERY", "restart", kOption,
     "On a rank's failure: restart (every rank) or in_process (replace the failed rank; see README)"},
    {"spares_per_node", "", "PET_SPARES_PER_NODE", "0", kOption,
     "With --recovery=in_process: warm spare processes per node that take a failed rank's place at once"},
    {"torch_store", "", "PET_TORCH_STORE", "auto", kOption,
     "Who serves torch's store: agent (ddprun, outlives every rank), rank0 (rank 0's TCPStore), auto"},
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
     "Seconds without a heartbeat after which a rank counts as hung (0: off; auto: learned per section)"},
    {"finish_timeout", "", "PET_FINISH_TIMEOUT", "300", kOption,
     "Seconds the other ranks may run on once a rank of the job exited 0 (0: off)"},
    {"exclude_node_after", "", "PET_EXCLUDE_NODE_AFTER", "0", kOption,
     "Exclude a node (exit 201) whose workers caused K failures of the job; a standby takes its place (0: off)"},
    {"stop_without_progress", "", "PET_STOP_WITHOUT_PROGRESS", "0", kOption,
     "End the job after K restarts in a row in which no rank beat a step beyond the earlier attempts' (0: off)"},
    {"signals_to_handle", "", "PET_SIGNALS_TO_HANDLE", "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2", kOption,
     "Signals forwarded to the workers"},
    {"role", "", "PET_ROLE", "default", kOption, "Role name of the workers (ROLE_NAME)"},
    {"module", "-m", "PET_MODULE", "", kSwitch, "PROGRAM is a Python module, run as python -u -m PROGRAM"},
    {"no_python", "", "PET_NO_PYTHON", "", kSwitch, "Run PROGRAM directly, even if it ends in .py"},
    {"run_path", "", "PET_RUN_PATH", "", kSwitch,
     "Run PROGRAM (an absolute path to a .py file) with runpy.run_path; takes precedence over --no_python"},
    {"virtual_local_rank", "", "PET_VIRTUAL_LOCAL_RANK", "", kSwitch,
     "LOCAL_RANK=0 and one device per worker in CUDA_VISIBLE_DEVICES"},
    {"legacy_local_rank", "", "PET_LEGACY_LOCAL_RANK", "", kOption,
     "Pass --local_rank=N (underscore) or --local-rank=N (dash) after PROGRAM, as torch.distributed.launch"},
    {"log_dir", "", "PET_LOG_DIR", "", kOption, "Keep per-attempt, per-rank stdout/stderr/error files here"},
    {"redirects", "-r", "PET_REDIRECTS", "0", kOption, "Streams sent to files only: 0-3 or LOCAL_RANK:N,..."},
    {"tee", "-t", "PET_TEE", "0", kOption, "Streams sent to files and the console: 0-3 or LOCAL_RANK:N,..."},
    {"local_ranks_filter", "", "PET_LOCAL_RANKS_FILTER", "", kOption,
     "Local ranks whose output reaches the console, e.g. 0,1"},
    {"log_line_prefix_template", "", "PET_LOG_LINE_PREFIX_TEMPLATE", "[{role}{local_rank}]:", kOption,
     "Console line prefix; fields {rank} {local_rank} {role} {host}"},
    {"duplicate_stdout_filters", "", "PET_DUPLICATE_STDOUT_FILTERS", "", kOption,
     "Tee'd stdout lines holding any of these (a,b; ,, for a comma) also go to attempt_N/filtered_stdout.log"},
    {"duplicate_stderr_filters", "", "PET_DUPLICATE_STDERR_FILTERS", "", kOption,
     "Tee'd stderr lines holding any of these also go to attempt_N/filtered_stderr.log"},
    {"logs_specs", "", "PET_LOGS_SPECS", "", kOption,
     "Accepted for torchrun compatibility: only the built-in logs spec exists (a plugin name is refused)"},
    {"event_log_handler", "", "PET_EVENT_LOG_HANDLER", "null", kOption,
     "torchelastic events (JSON lines): null (none) or console (ddprun's stderr)"},
    {"timeline", "", "PET_TIMELINE", "", kOption,
     "Write this node's events (rounds, workers started and failed, restarts, hangs, the end) to FILE as JSON lines"},
    {"metrics_port", "", "PET_METRICS_PORT", "", kOption,
     "Serve this node's Prometheus metrics and /healthz, /readyz on PORT (0: any free port; default: none)"},
    {"metrics_bind", "", "PET_METRICS_BIND", "127.0.0.1", kOption,
     "Address of the metrics port (a Kubernetes probe needs the pod address)"},
    {"numa_binding", "", "PET_NUMA_BINDING", "", kOption,
     "Bind each worker to CPUs near its GPU: node, socket, exclusive or core-complex"},
    {"log_level", "", "LOGLEVEL", "warning", kOption, "ddprun's own log level: debug, info, warning, error"},
    {"dry_run", "", "", "", kSwitch, "Print the rank map and each worker's environment; start nothing"},
    {"print_completion", "", "", "", kOption, "Print a completion script for bash, zsh or tcsh and exit"},
    {"no_slurm", "", "PET_NO_SLURM", "", kSwitch, "Inside a Slurm step, take nothing from it (see README: Slurm)"},
};

// '-' and '_' are one letter in flag names.
bool sameLetter(char a, char b) { return (a == '-' ? '_' : a) == (b == '-' ? '_' : b); }

bool sameName(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!sameLetter(a[i], b[i])) return false;
  }
  return true;
}

const FlagSpec* optionNamed(std::string_view word) {
  for (const FlagSpec& flag : kFlags) {
    if (!flag.shortName.empty() && word == flag.shortName) return &flag;
    if (word.starts_with("--") && sameName(word.substr(2), flag.name)) return &flag;
  }
  return nullptr;
}

// The words before the program: calls visit(index, flag or null) for each flag word and skips
// the value of an option written as two words. Stops at the program or at "--".
template <typename Visit>
void scanFlags(int argc, const char* const* argv, Visit visit) {
  for (int i = 1; i < argc; ++i) {
    std::string_view word = argv[i];
    if (word == "--" || !word.starts_with("-") || word == "-") return;  // the program
    const FlagSpec* flag = optionNamed(word.substr(0, word.find('=')));
    if (!visit(i, flag)) return;
    if (flag && flag->kind == FlagKind::kOption && word.find('=') == std::string_view::npos) ++i;  // its value
  }
}

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
    // As argparse: a repeated option takes its last value (CLI11 would refuse the second).
    option->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  }
}

std::string completionScript(const std::string& shell) {
  std::string words;
  for (const FlagSpec& flag : kFlags) {
    std::string dashed(flag.name);
    std::replace(dashed.begin(), dashed.end(), '_', '-');
    words += (words.empty() ? "" : " ") + std::string(flag.name) + (dashed != flag.name ? " " + dashed : "");
  }
  if (shell == "tcsh") return "complete ddprun 'c/--/(" + words + ")/' 'p/*/f/'\n";
  std::string dashedWords;
  for (const auto& w : split(words, ' ')) dashedWords += (dashedWords.empty() ? "--" : " --") + std::string(w);
  std::string bash = "_ddprun() {\n"
                     "  local cur=\"${COMP_WORDS[COMP_CWORD]}\"\n"
                     "  if [[ \"$cur\" == -* ]]; then\n"
                     "    COMPREPLY=( $(compgen -W \"" + dashedWords + "\" -- \"$cur\") )\n"
                     "  else\n"
                     "    COMPREPLY=( $(compgen -f -- \"$cur\") )\n"
                     "  fi\n"
                     "}\n"
                     "complete -o filenames -F _ddprun ddprun\n";
  if (shell == "bash") return bash;
  if (shell == "zsh") return "autoload -U +X bashcompinit && bashcompinit\n" + bash;
  throw ConfigError("--print_completion '" + shell.substr(0, 64) + "': expected bash, zsh or tcsh");
}

bool flagGiven(const CLI::App& app, std::string_view name) {
  const FlagSpec& flag = findFlag(name);
  const std::string env(flag.envName);
  return app.count("--" + std::string(flag.name)) > 0 || (!env.empty() && std::getenv(env.c_str()) != nullptr);
}

std::optional<std::string> flagTakenAsValue(int argc, const char* const* argv) {
  std::optional<std::string> problem;
  scanFlags(argc, argv, [&](int i, const FlagSpec* flag) {
    std::string_view word = argv[i];
    if (!flag || flag->kind == FlagKind::kSwitch || word.find('=') != std::string_view::npos) return true;
    if (i + 1 >= argc) return false;  // CLI11 reports the missing value
    std::string_view value = argv[i + 1];
    if (value.starts_with("--")) {
      problem = std::string(word) + " needs a value, and '" + std::string(value.substr(0, 64)) +
                "' is a flag (write " + std::string(word) + "=" + std::string(value.substr(0, 64)) +
                " if it really is the value)";
      return false;
    }
    return true;
  });
  return problem;
}

ExpandedArgs expandAbbreviations(int argc, const char* const* argv) {
  ExpandedArgs out;
  if (argc > 1) out.args.assign(argv + 1, argv + argc);
  // Expanding a word can turn the next word into an option's value, so scan again after each.
  for (bool changed = true; changed && !out.error;) {
    changed = false;
    std::vector<const char*> words{argv[0]};
    for (const auto& a : out.args) words.push_back(a.c_str());
    scanFlags(static_cast<int>(words.size()), words.data(), [&](int i, const FlagSpec* flag) {
      std::string_view word = words[i];
      if (flag || !word.starts_with("--") || word.size() == 2) return true;
      std::size_t eq = word.find('=');
      std::string_view prefix = word.substr(2, eq == std::string_view::npos ? std::string_view::npos : eq - 2);
      std::vector<const FlagSpec*> matches;
      for (const FlagSpec& f : kFlags) {
        if (!f.aliasOf.empty() || prefix.size() >= f.name.size()) continue;
        if (sameName(prefix, f.name.substr(0, prefix.size()))) matches.push_back(&f);
      }
      if (matches.empty()) return true;  // unknown: the parser says so
      if (matches.size() > 1) {
        std::string names;
        for (const FlagSpec* m : matches) names += (names.empty() ? "--" : ", --") + std::string(m->name);
        out.error = "ambiguous option: " + std::string(word.substr(0, eq).substr(0, 64)) + " could match " + names;
        return false;
      }
      std::string full = "--" + std::string(matches[0]->name);
      if (eq != std::string_view::npos) full += std::string(word.substr(eq));
      out.args[static_cast<std::size_t>(i - 1)] = full;
      changed = true;
      return false;
    });
  }
  return out;
}

}  // namespace ddprun
