#include "agent/worker_specs.h"

#include <algorithm>
#include <filesystem>

#include "agent/filtered_log.h"
#include "agent/worker_env.h"
#include "common/error.h"
#include "common/store_prefix.h"

namespace ddprun {

namespace {

namespace fs = std::filesystem;

struct FilteredLogs {
  std::shared_ptr<FilteredLog> out;
  std::shared_ptr<FilteredLog> err;
};

void createFolder(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw ConfigError("cannot create " + dir.string() + ": " + ec.message());
}

// One file per stream and attempt, shared by the ranks, as torchrun's.
FilteredLogs openFilteredLogs(const AgentOptions& options, const RoundInfo& round) {
  const LogOptions& log = options.log;
  FilteredLogs logs;
  if (log.duplicateStdoutFilters.empty() && log.duplicateStderrFilters.empty()) return logs;
  const fs::path dir = fs::path(options.runDir) / ("attempt_" + std::to_string(round.restartCount));
  createFolder(dir);
  if (!log.duplicateStdoutFilters.empty()) {
    logs.out = std::make_shared<FilteredLog>((dir / "filtered_stdout.log").string(), log.duplicateStdoutFilters);
  }
  if (!log.duplicateStderrFilters.empty()) {
    logs.err = std::make_shared<FilteredLog>((dir / "filtered_stderr.log").string(), log.duplicateStderrFilters);
  }
  return logs;
}

WorkerSpec makeSpec(const AgentOptions& options, const RoundInfo& round, int localRank, const FilteredLogs& filtered,
                    const std::function<WorkerChannelEnd(int)>& channel) {
  const std::string attempt = "attempt_" + std::to_string(round.restartCount);
  const fs::path dir = fs::path(options.runDir) / attempt / std::to_string(localRank);
  std::error_code ec;
  // A rank's files: attempt_N/<local rank>/NAME as torchrun lays them out, or, in ddprun's own
  // temporary folder, attempt_N.<local rank>.NAME beside each other (no folder to create and
  // remove per rank: on ext4 with discard that was a millisecond of every launch).
  auto rankFile = [&](const std::string& name) {
    return options.flatRunDir ? (fs::path(options.runDir) / (attempt + "." + std::to_string(localRank) + "." + name)).string()
                              : (dir / name).string();
  };
  if (!options.flatRunDir) createFolder(dir);

  WorkerEnvInputs envIn;
  envIn.agentStore = options.torchStore != nullptr;
  envIn.recoverInProcess = options.recovery == AgentOptions::Recovery::kInProcess;
  envIn.inherited = options.inherited;
  envIn.round = round;
  envIn.localRank = localRank;
  envIn.localWorldSize = options.nprocPerNode;
  envIn.role = options.role;
  envIn.maxRestarts = options.maxRestarts;
  envIn.runId = options.runId;
  envIn.errorFile = rankFile("error.json");
  envIn.virtualLocalRank = options.virtualLocalRank;
  fs::remove(envIn.errorFile, ec);
  const std::string flightRecorder = rankFile("flight_recorder");
  fs::remove(flightRecorder, ec);

  WorkerSpec spec;
  spec.localRank = localRank;
  spec.rank = round.rankOffset + localRank;
  spec.errorFile = envIn.errorFile;
  spec.flightRecorder = flightRecorder;
  spec.request.executable = options.executable;
  spec.request.args = options.args;
  if (!options.localRankArg.empty()) {
    auto at = spec.request.args.begin() +
              static_cast<std::ptrdiff_t>(std::min(options.localRankArgAt, spec.request.args.size()));
    spec.request.args.insert(at, options.localRankArg + "=" + std::to_string(localRank));
  }
  spec.request.env = buildWorkerEnv(envIn);
  if (static_cast<std::size_t>(localRank) < options.workerCpus.size()) {
    spec.request.cpus = options.workerCpus[static_cast<std::size_t>(localRank)];
  }
  if (channel) {
    WorkerChannelEnd end = channel(localRank);
    for (const auto& [name, value] : end.env) spec.request.env.set(name, value);
    spec.request.inheritFd = end.fd;
  }
  // A Python rank then dumps its stack on the SIGABRT that ends it when it hangs (stack_dump.h).
  if (!options.inherited.get("PYTHONFAULTHANDLER")) spec.request.env.set("PYTHONFAULTHANDLER", "1");
  spec.request.env.set("DDPRUN_FLIGHT_RECORDER", flightRecorder);

  const LogOptions& log = options.log;
  const int redirected = log.redirects.forRank(localRank);
  const int teed = log.tee.forRank(localRank);
  const bool shown = log.consoleRanks.empty() || log.consoleRanks.count(localRank);
  auto& out = spec.output;
  out.prefix = expandPrefix(log.prefixTemplate, PrefixFields{spec.rank, localRank, options.role, options.host});
  if (shown && (!(redirected & kStdout) || (teed & kStdout))) out.stdoutConsole = options.stdoutConsole;
  if (shown && (!(redirected & kStderr) || (teed & kStderr))) out.stderrConsole = options.stderrConsole;
  if (options.writeLogFiles || ((redirected | teed) & kStdout)) out.stdoutFile = rankFile("stdout.log");
  if (options.writeLogFiles || ((redirected | teed) & kStderr)) out.stderrFile = rankFile("stderr.log");
  if (teed & kStdout) out.stdoutFiltered = filtered.out;
  if (teed & kStderr) out.stderrFiltered = filtered.err;
  return spec;
}

}  // namespace

void WorkerSpecs::placeFileStore(RoundInfo& round) const {
  const fs::path dir = options_.flatRunDir
                           ? fs::path(options_.runDir) / ("store_round_" + std::to_string(round.round))
                           : fs::path(options_.runDir) / "store" / ("round_" + std::to_string(round.round));
  std::error_code ec;
  fs::remove_all(dir, ec);
  createFolder(dir);
  round.storeAddr = "file://" + dir.string();
  round.storePrefix = storePrefix(options_.runId, round.round);
}

namespace {
// A rank's own variables: a spare has none of them until it becomes a rank.
constexpr const char* kRankOnly[] = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                     "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR",
                                     "MASTER_PORT", "TORCHELASTIC_ERROR_FILE"};
}  // namespace

WorkerSpec WorkerSpecs::makeSpare(const RoundInfo& round, int key,
                                  const std::function<WorkerChannelEnd(int)>& channel) const {
  std::function<WorkerChannelEnd(int)> keyed;
  if (channel) keyed = [&](int) { return channel(key); };
  WorkerSpec spec = makeSpec(options_, round, 0, FilteredLogs{}, keyed);
  for (const char* name : kRankOnly) spec.request.env.unset(name);
  if (options_.virtualLocalRank) {
    spec.request.env.unset("CUDA_VISIBLE_DEVICES");
    if (auto visible = options_.inherited.get("CUDA_VISIBLE_DEVICES")) spec.request.env.set("CUDA_VISIBLE_DEVICES", *visible);
  }
  spec.request.env.unset("DDPRUN_FLIGHT_RECORDER");  // rank 0's file: a spare writes none
  spec.request.env.set("DDPRUN_SPARE", "1");
  spec.rank = -1;
  spec.localRank = key;
  spec.errorFile.clear();
  spec.output.prefix = "[spare" + std::to_string(key) + "]:";
  spec.output.stdoutFile.clear();
  spec.output.stderrFile.clear();
  spec.output.stdoutFiltered.reset();
  spec.output.stderrFiltered.reset();
  return spec;
}

std::vector<std::pair<std::string, std::string>> WorkerSpecs::spareContract(const WorkerSpec& rankSpec) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const char* name : {"LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE",
                           "TORCHELASTIC_ERROR_FILE", "CUDA_VISIBLE_DEVICES"}) {
    if (auto value = rankSpec.request.env.get(name)) out.emplace_back(name, *value);
  }
  return out;
}

std::vector<WorkerSpec> WorkerSpecs::make(const RoundInfo& round,
                                          const std::function<WorkerChannelEnd(int)>& channel) const {
  std::vector<WorkerSpec> specs;
  const FilteredLogs filtered = openFilteredLogs(options_, round);
  for (int localRank = 0; localRank < options_.nprocPerNode; ++localRank) {
    specs.push_back(makeSpec(options_, round, localRank, filtered, channel));
  }
  return specs;
}

}  // namespace ddprun
