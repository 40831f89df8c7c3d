#include "launcher/launch.h"

#include <signal.h>
#include <unistd.h>
#include <spdlog/spdlog.h>
#include <stdlib.h>

#include <cstring>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <filesystem>
#include <iostream>
#include <random>

#include "agent/agent_metrics.h"
#include "agent/console_log_sink.h"
#include "agent/console_writer.h"
#include "agent/elastic_agent.h"
#include "launcher/cli.h"
#include "agent/posix_process_supervisor.h"
#include "agent/socket_heartbeat_source.h"
#include "agent/timeline.h"
#include "agent/torch_store.h"
#include "agent/worker_env.h"
#include "common/error.h"
#include "common/net.h"
#include "common/strings.h"
#include "rendezvous/client/local_rendezvous.h"

namespace ddprun {
namespace {

namespace fs = std::filesystem;

// Where this run's per-attempt files go. A temporary folder is removed at the end unless it holds
// logs the user asked for (redirects/tee without --log_dir), whose path is then printed.
class RunDir {
 public:
  explicit RunDir(const LaunchConfig& cfg) {
    bool wantsFiles = cfg.log.redirects.all || cfg.log.tee.all || !cfg.log.redirects.perRank.empty() ||
                      !cfg.log.tee.perRank.empty();
    std::string base = cfg.log.logDir;
    if (base.empty()) {
      const char* tmp = std::getenv("TMPDIR");
      base = tmp && *tmp ? tmp : "/tmp";
      temporary_ = !wantsFiles;
    }
    std::error_code ec;
    fs::create_directories(base, ec);
    std::string tmpl = (fs::path(base) / ((cfg.log.logDir.empty() ? "ddprun_" : cfg.runId + "_") + "XXXXXX")).string();
    if (!::mkdtemp(tmpl.data())) throw ConfigError("cannot create a log folder under " + base + ": " + std::strerror(errno));
    path_ = tmpl;
    if (!temporary_) spdlog::warn("worker logs go to {}", path_);
  }
  ~RunDir() {
    std::error_code ec;
    if (temporary_) fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  bool temporary() const { return temporary_; }

 private:
  std::string path_;
  bool temporary_ = false;
};

AgentOptions agentOptions(const LaunchConfig& cfg, const std::string& runDir) {
  AgentOptions o;
  o.programName = cfg.program;
  o.executable = cfg.executable;
  o.args = cfg.execArgs;
  o.localRankArg = cfg.localRankArg;
  o.eventLogToConsole = cfg.eventLogHandler == "console";
  o.workerCpus = cfg.workerCpus;
  // torch's names: its standalone and elastic rendezvous are c10d, as ddprun's grpc is.
  o.rdzvBackend = cfg.standalone || cfg.rdzvBackend == RdzvBackend::kGrpc ? "c10d" : backendName(cfg.rdzvBackend);
  o.localRankArgAt = cfg.localRankArgAt;
  o.inherited = Environment::fromCurrentProcess();
  // torchrun 2.x puts its --signals_to_handle into its own environment, so its workers inherit it.
  o.inherited.set("TORCHELASTIC_SIGNALS_TO_HANDLE", cfg.signalsToHandleText);
  o.nprocPerNode = cfg.nprocPerNode;
  o.role = cfg.role;
  o.maxRestarts = cfg.maxRestarts;
  o.runId = cfg.runId;
  o.host = hostName();
  o.virtualLocalRank = cfg.virtualLocalRank;
  o.shutdownGrace = std::chrono::milliseconds(static_cast<int64_t>(cfg.shutdownTimeoutSeconds * 1000));
  o.hangTimeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.hangTimeoutSeconds * 1000));
  o.hangTimeoutAuto = cfg.hangTimeoutAuto;
  o.finishTimeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.finishTimeoutSeconds * 1000));
  o.stopWithoutProgress = cfg.stopWithoutProgress;
  o.recovery = cfg.recoverInProcess ? AgentOptions::Recovery::kInProcess : AgentOptions::Recovery::kRestart;
  o.sparesPerNode = cfg.sparesPerNode;
  o.log = cfg.log;
  o.runDir = runDir;
  o.writeLogFiles = !cfg.log.logDir.empty();
  return o;
}

LocalRendezvousOptions rendezvousOptions(const LaunchConfig& cfg) {
  LocalRendezvousOptions o;
  o.localWorldSize = cfg.nprocPerNode;
  o.maxRestarts = cfg.maxRestarts;
  o.masterAddr = cfg.masterAddr;
  // Static mode keeps torchrun's fixed port; standalone picks a free one each round.
  o.masterPort = (cfg.standalone && !cfg.masterPortGiven) ? 0 : cfg.masterPort;
  o.nodeId = hostName();
  return o;
}

}  // namespace

int launch(const LaunchConfig& cfg, const MultiNodeStarter& startMultiNode) {
  ::signal(SIGPIPE, SIG_IGN);  // a closed console must not kill the agent; workers get it back
  // The console never blocks supervision: worker lines, the failure report and ddprun's own log
  // are queued (bounded) and written by threads of their own; lines nobody reads are dropped and
  // counted there, never in the log files.
  auto console = std::make_shared<ConsoleWriter>(ConsoleWriterOptions{STDOUT_FILENO});
  auto consoleErr = std::make_shared<ConsoleWriter>(ConsoleWriterOptions{STDERR_FILENO});
  ConsoleLogRoute logRoute(consoleErr);
  boost::asio::io_context io;
  boost::asio::signal_set signals(io);
  for (int sig : cfg.signalsToHandle) signals.add(sig);

  RunDir runDir(cfg);
  PosixProcessSupervisor supervisor(
      io, PosixProcessSupervisorOptions{defaultWatchdogPath(), runDir.temporary() ? runDir.path() : std::string()});
  // Opened before anything starts, so that a path or port that cannot be used is exit 2 at once.
  std::vector<std::shared_ptr<AgentObserver>> observers;
  if (!cfg.timeline.empty()) observers.push_back(std::make_shared<TimelineWriter>(cfg.timeline));
  if (cfg.metrics.port >= 0) {
    auto metrics = std::make_shared<AgentMetrics>(cfg.metrics, cfg.nprocPerNode);
    spdlog::info("metrics and probes on http://{}/metrics", metrics->address());
    observers.push_back(std::move(metrics));
  }
  MultiNodeRendezvous multiNode;
  std::unique_ptr<Rendezvous> rendezvous;
  if (cfg.multiNode) {
    DDPRUN_CHECK(startMultiNode != nullptr, "multi-node job in a build without the gRPC rendezvous");
    multiNode = startMultiNode(
        cfg, [&io](std::function<void()> fn) { boost::asio::post(io, std::move(fn)); },
        [&supervisor](std::chrono::steady_clock::time_point deadline) { supervisor.setFenceDeadline(deadline); });
    rendezvous = std::move(multiNode.client);
  } else {
    rendezvous = std::make_unique<LocalRendezvous>(
        rendezvousOptions(cfg), [&io](std::function<void()> fn) { boost::asio::post(io, std::move(fn)); });
  }
  std::shared_ptr<TorchStore> torchStore;
  if (cfg.agentTorchStore()) {
    TorchStoreOptions store;
    // A user's --master_port is kept on one node (every restart sees it); otherwise a free port,
    // held from now on, so that no restart collides on it. Across nodes --master_port is the
    // static rendezvous' own port.
    if (!cfg.multiNode && cfg.masterPortGiven) store.port = cfg.masterPort;
    store.sinksFor = multiNode.torchStoreSinks;
    if (!cfg.multiNode || store.sinksFor) {
      torchStore = std::make_shared<TorchStore>(std::move(store));
      spdlog::debug("serving torch's store at {}:{}", TorchStore::kAddress, torchStore->port());
    }
  }
  AgentOptions options = agentOptions(cfg, runDir.path());
  options.torchStore = torchStore;
  options.flatRunDir = runDir.temporary();
  if (!cfg.tokenFile.empty()) options.inherited.set("DDPRUN_RDZV_TOKEN_FILE", cfg.tokenFile);
  for (const auto& [name, value] : multiNode.workerEnv) options.inherited.set(name, value);
  options.stdoutConsole = console;
  options.stderrConsole = consoleErr;
  options.observers = observers;
  options.nodeId = multiNode.nodeId;
  // Always listening: heartbeats also tell a rank alive past --finish_timeout, and how far an
  // attempt got; only --hang_timeout makes silence a hang.
  options.heartbeats = std::make_shared<SocketHeartbeatSource>(io);
  ElasticAgent agent(io, *rendezvous, supervisor, std::move(options));

  std::function<void()> waitForSignal = [&] {
    signals.async_wait([&](const boost::system::error_code& ec, int sig) {
      if (ec) return;
      agent.handleSignal(sig);
      waitForSignal();
    });
  };
  waitForSignal();

  int status = 1;
  agent.start([&](int exitStatus) {
    status = exitStatus;
    io.stop();
  });
  io.run();
  if (torchStore) torchStore->stop();  // before the rendezvous and the store it forwards to
  // Our own session ends first; a hosted server then gives the other agents time to read the end
  // of the job before it stops.
  rendezvous.reset();
  if (multiNode.server) {
    multiNode.server->shutdown(std::chrono::milliseconds(static_cast<int64_t>(cfg.closeTimeoutSeconds * 1000)));
  }
  // What the console still holds gets a bounded chance; a console nobody reads cannot keep ddprun
  // from exiting with the job's status.
  console->flush(std::chrono::seconds(2));
  consoleErr->flush(std::chrono::seconds(2));
  return status;
}

int printDryRun(const LaunchConfig& cfg) {
  RoundInfo round;
  round.worldSize = cfg.nprocPerNode;
  round.masterAddr = cfg.masterAddr;
  round.masterPort = (cfg.standalone && !cfg.masterPortGiven) ? findFreePort(cfg.masterAddr) : cfg.masterPort;
  std::cout << "ddprun dry run: " << cfg.nprocPerNode << " worker(s) on this node, run id " << cfg.runId << "\n";
  if (cfg.multiNode) {
    // Only static mode knows the ranks before the rendezvous; elastic ranks come from the round.
    bool isStatic = cfg.rdzvBackend == RdzvBackend::kStatic;
    round.groupRank = isStatic ? cfg.nodeRank : 0;
    round.groupWorldSize = cfg.minNodes;
    round.rankOffset = isStatic ? cfg.nodeRank * cfg.nprocPerNode : 0;
    round.worldSize = cfg.minNodes * cfg.nprocPerNode;
    round.masterAddr = "<group rank 0's address>";
    round.masterPort = 0;
    round.round = 1;
    std::cout << "rendezvous: " << backendName(cfg.rdzvBackend) << " at " << cfg.endpointHost << ":" << cfg.endpointPort << ", "
              << cfg.minNodes << ".." << cfg.maxNodes << " nodes"
              << (isStatic ? "" : "; ranks below assume this node gets group rank 0 of the minimum") << "\n";
  }
  if (!cfg.slurmHosts.empty()) {
    std::cout << "slurm: " << cfg.slurmStep << "\n";
    for (std::size_t rank = 0; rank < cfg.slurmHosts.size(); ++rank) {
      std::cout << "node " << rank << ": " << printable(cfg.slurmHosts[rank], 256) << "\n";
    }
  }
  std::cout << "command: " << cfg.executable;
  for (std::size_t i = 0; i <= cfg.execArgs.size(); ++i) {
    if (!cfg.localRankArg.empty() && i == cfg.localRankArgAt) std::cout << " " << cfg.localRankArg << "=<local rank>";
    if (i < cfg.execArgs.size()) std::cout << " " << cfg.execArgs[i];
  }
  std::cout << "\n\nrank map (local_rank -> rank):\n";
  for (int i = 0; i < cfg.nprocPerNode; ++i) {
    std::cout << "  " << i << " -> " << round.rankOffset + i;
    if (static_cast<std::size_t>(i) < cfg.workerCpus.size()) {
      std::cout << "  cpus";
      for (int c : cfg.workerCpus[static_cast<std::size_t>(i)]) std::cout << " " << c;
    }
    std::cout << "\n";
  }
  Environment inherited = Environment::fromCurrentProcess();
  for (int i = 0; i < cfg.nprocPerNode; ++i) {
    WorkerEnvInputs in;
    in.inherited = inherited;
    in.round = round;
    in.localRank = i;
    in.localWorldSize = cfg.nprocPerNode;
    in.role = cfg.role;
    in.maxRestarts = cfg.maxRestarts;
    in.runId = cfg.runId;
    in.errorFile = "<log folder>/attempt_0/" + std::to_string(i) + "/error.json";
    in.virtualLocalRank = cfg.virtualLocalRank;
    in.agentStore = cfg.agentTorchStore();
    in.recoverInProcess = cfg.recoverInProcess;
    if (in.agentStore) {
      in.round.masterAddr = TorchStore::kAddress;
      in.round.masterPort = (!cfg.multiNode && cfg.masterPortGiven) ? cfg.masterPort : 0;
    }
    Environment env = buildWorkerEnv(in);
    if (in.agentStore && in.round.masterPort == 0) env.set("MASTER_PORT", "<a free port, chosen at start>");
    std::cout << "\nlocal rank " << i << " environment (set by ddprun; everything else is inherited):\n";
    for (const auto& name : contractVariableNames()) {
      auto value = env.get(name);
      if (value && (inherited.get(name) != value || name == "OMP_NUM_THREADS")) {
        std::cout << "  " << name << "=" << *value << "\n";
      }
    }
  }
  return 0;
}

namespace {

// Multi-node jobs run in ddprun-multinode (same launcher plus the gRPC rendezvous), so that the
// common single-node agent never loads gRPC.
int execMultiNode(char** argv) {
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  std::string path = ec ? "ddprun-multinode" : (self.parent_path() / "ddprun-multinode").string();
  ::execv(path.c_str(), argv);
  std::cerr << "ddprun: error: multi-node jobs need " << path << " next to ddprun: " << std::strerror(errno) << "\n";
  return 1;
}

}  // namespace

int launcherMain(int argc, char** argv, const MultiNodeStarter& startMultiNode, const VersionText& versionText) {
  auto parsed = parseCommandLine(argc, argv, versionText);
  if (parsed.kind == ParseResult::Kind::kExit) return parsed.exitStatus;
  try {
    if (parsed.config.dryRun) return printDryRun(parsed.config);
    if (parsed.config.multiNode && !startMultiNode) return execMultiNode(argv);
    return launch(parsed.config, startMultiNode);
  } catch (const ConfigError& e) {
    std::cerr << "ddprun: error: " << oneLine(e.what()) << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "ddprun: error: " << oneLine(e.what()) << "\n";
    return 1;
  }
}

}  // namespace ddprun
