#include "launcher/cli.h"

#include <signal.h>

#include <catch2/catch.hpp>
#include <initializer_list>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "test_util.h"

using ddprun::parseCommandLine;
using ddprun::ParseResult;
using ddprun::test::OutputCapture;
using ddprun::test::ScopedEnv;
using Kind = ddprun::ParseResult::Kind;

namespace {

// The PET_* defaults a test must not inherit from whoever runs it.
struct CleanPetEnv {
  ScopedEnv nproc{"PET_NPROC_PER_NODE", std::nullopt};
  ScopedEnv nnodes{"PET_NNODES", std::nullopt};
  ScopedEnv standalone{"PET_STANDALONE", std::nullopt};
  ScopedEnv masterPort{"PET_MASTER_PORT", std::nullopt};
  ScopedEnv masterAddr{"PET_MASTER_ADDR", std::nullopt};
  ScopedEnv maxRestarts{"PET_MAX_RESTARTS", std::nullopt};
  ScopedEnv rdzvId{"PET_RDZV_ID", std::nullopt};
  ScopedEnv runId{"PET_RUN_ID", std::nullopt};
  ScopedEnv nodeRank{"PET_NODE_RANK", std::nullopt};
  ScopedEnv rdzvBackend{"PET_RDZV_BACKEND", std::nullopt};
  ScopedEnv rdzvEndpoint{"PET_RDZV_ENDPOINT", std::nullopt};
  ScopedEnv rdzvConf{"PET_RDZV_CONF", std::nullopt};
  ScopedEnv localAddr{"PET_LOCAL_ADDR", std::nullopt};
  ScopedEnv redirects{"PET_REDIRECTS", std::nullopt};
  ScopedEnv tee{"PET_TEE", std::nullopt};
  ScopedEnv logLevel{"LOGLEVEL", std::nullopt};
  ScopedEnv legacyLocalRank{"PET_LEGACY_LOCAL_RANK", std::nullopt};
  ScopedEnv shutdown{"PET_SHUTDOWN_TIMEOUT", std::nullopt};
  ScopedEnv torchShutdown{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", std::nullopt};
  ScopedEnv prefix{"PET_LOG_LINE_PREFIX_TEMPLATE", std::nullopt};
  ScopedEnv torchPrefix{"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", std::nullopt};
  ScopedEnv noSlurm{"PET_NO_SLURM", std::nullopt};
  ScopedEnv slurmJob{"SLURM_JOB_ID", std::nullopt};  // no Slurm: flags and PET_* alone decide
};

// Parses `ddprun ARGS...`; stderr (error messages) is kept in `err`.
struct Parsed {
  ParseResult result;
  std::string err;
  std::string out;
};

Parsed parse(std::initializer_list<const char*> args) {
  std::vector<const char*> argv{"ddprun"};
  argv.insert(argv.end(), args.begin(), args.end());
  Parsed parsed;
  OutputCapture err(2);
  OutputCapture out(1);
  parsed.result = parseCommandLine(static_cast<int>(argv.size()), argv.data());
  parsed.out = out.text();
  parsed.err = err.text();
  return parsed;
}

// A run result; fails the test with the error text otherwise.
ddprun::LaunchConfig parseRun(std::initializer_list<const char*> args) {
  Parsed parsed = parse(args);
  INFO("stderr: " << parsed.err);
  REQUIRE(parsed.result.kind == Kind::kRun);
  return parsed.result.config;
}

// Expects a usage error: exit status 2 and a one-line message on stderr.
void expectUsageError(std::initializer_list<const char*> args, const std::string& mentioned = "") {
  Parsed parsed = parse(args);
  INFO("stderr: " << parsed.err);
  CHECK(parsed.result.kind == Kind::kExit);
  CHECK(parsed.result.exitStatus == 2);
  CHECK_THAT(parsed.err, Catch::Contains("error"));
  if (!mentioned.empty()) CHECK_THAT(parsed.err, Catch::Contains(mentioned));
}

}  // namespace

TEST_CASE("nproc_per_node in both spellings, with = or a separate value", "[cli]") {
  CleanPetEnv clean;
  CHECK(parseRun({"--nproc_per_node=4", "/bin/true"}).nprocPerNode == 4);
  CHECK(parseRun({"--nproc-per-node", "4", "/bin/true"}).nprocPerNode == 4);
  CHECK(parseRun({"--nproc_per_node", "3", "/bin/true"}).nprocPerNode == 3);
  CHECK(parseRun({"--nproc-per-node=2", "/bin/true"}).nprocPerNode == 2);
  CHECK(parseRun({"/bin/true"}).nprocPerNode == 1);
}

TEST_CASE("PET_NPROC_PER_NODE is the default and the flag overrides it", "[cli]") {
  CleanPetEnv clean;
  ScopedEnv pet("PET_NPROC_PER_NODE", "3");
  CHECK(parseRun({"/bin/true"}).nprocPerNode == 3);
  CHECK(parseRun({"--nproc_per_node=2", "/bin/true"}).nprocPerNode == 2);
}

TEST_CASE("PET_MAX_RESTARTS is the default for --max_restarts", "[cli]") {
  CleanPetEnv clean;
  ScopedEnv pet("PET_MAX_RESTARTS", "5");
  CHECK(parseRun({"/bin/true"}).maxRestarts == 5);
  CHECK(parseRun({"--max-restarts", "1", "/bin/true"}).maxRestarts == 1);
}

TEST_CASE("arguments after PROGRAM reach the program untouched", "[cli]") {
  CleanPetEnv clean;
  auto cfg = parseRun({"/bin/echo", "--nproc_per_node", "7", "-m"});
  CHECK(cfg.program == "/bin/echo");
  CHECK(cfg.programArgs == std::vector<std::string>{"--nproc_per_node", "7", "-m"});
  CHECK(cfg.nprocPerNode == 1);
  CHECK_FALSE(cfg.module);
  CHECK(cfg.executable == "/bin/echo");
  CHECK(cfg.execArgs == std::vector<std::string>{"--nproc_per_node", "7", "-m"});
}

TEST_CASE("flags --help, --version and -- after PROGRAM belong to the program", "[cli]") {
  CleanPetEnv clean;
  auto cfg = parseRun({"--nproc_per_node=2", "/bin/echo", "--help", "--", "x", "--version"});
  CHECK(cfg.nprocPerNode == 2);
  CHECK(cfg.programArgs == std::vector<std::string>{"--help", "--", "x", "--version"});
}

TEST_CASE("a -- before PROGRAM ends ddprun's flags", "[cli]") {
  CleanPetEnv clean;
  auto cfg = parseRun({"--nproc_per_node=2", "--", "/bin/echo", "hi"});
  CHECK(cfg.program == "/bin/echo");
  CHECK(cfg.programArgs == std::vector<std::string>{"hi"});
}

TEST_CASE("an unknown flag before PROGRAM is a usage error", "[cli]") {
  CleanPetEnv clean;
  expectUsageError({"--bogus", "/bin/true"}, "--bogus");
  expectUsageError({"--nproc_per_node=2", "--bogus=1", "/bin/true"}, "--bogus");
  expectUsageError({"-x", "/bin/true"}, "-x");
}

TEST_CASE("a missing PROGRAM is a usage error", "[cli]") {
  CleanPetEnv clean;
  expectUsageError({}, "PROGRAM");
  expectUsageError({"--nproc_per_node=2"}, "PROGRAM");
}

TEST_CASE("a PROGRAM that cannot run is a usage error naming it", "[cli]") {
  CleanPetEnv clean;
  expectUsageError({"/nonexistent/ddprun_test_tool"}, "/nonexistent/ddprun_test_tool");
  expectUsageError({"/tmp"}, "/tmp");
}

TEST_CASE("bad --nproc_per_node values are usage errors", "[cli]") {
  CleanPetEnv clean;
  expectUsageError({"--nproc_per_node=0", "/bin/true"}, "nproc_per_node");
  expectUsageError({"--nproc_per_node=1025", "/bin/true"}, "nproc_per_node");
  expectUsageError({"--nproc_per_node=abc", "/bin/true"}, "nproc_per_node");
}

TEST_CASE("flag --nnodes accepts N and MIN:MAX of one node", "[cli]") {
  CleanPetEnv clean;
  auto cfg = parseRun({"--nnodes", "1", "/bin/true"});
  CHECK(cfg.minNodes == 1);
  CHECK(cfg.maxNodes == 1);
  cfg = parseRun({"--nnodes=1:1", "/bin/true"});
  CHECK(cfg.minNodes == 1);
  CHECK(cfg.maxNodes == 1);
}

TEST_CASE("bad --nnodes values are usage errors", "[cli]") {
  CleanPetEnv clean;
  expectUsageError({"--nnodes", "3:2", "/bin/true"}, "--nnodes");
  expectUsageError({"--nnodes", "1:2:3", "/bin/true"}, "--nnodes");
  expectUsageError({"--nnodes", "0", "/bin/true"}, "--nnodes");
  expectUsageError({"--nnodes", "x", "/bin/true"}, "--nnodes");
  expectUsageError({"--nnodes", "1:", "/bin/true"}, "--nnodes");
}

TEST_CASE("flag --master_port must be a port number", "[cli]") {
  CleanPetEnv clean;
  expectUsageError({"--master_port", "0", "/bin/true"}, "--master_port");
  expectUsageError({"--master_port", "70000", "/bin/true"}, "--master_port");
  expectUsageError({"--master-port=http", "/bin/true"}, "--master_port");
  auto cfg = parseRun({"--master_port", "1234", "/bin/true"});
  CHECK(cfg.masterPort == 1234);
  CHECK(cfg.masterPortGiven);
  cfg = parseRun({"--master-port=65535", "/bin/true"});
  CHECK(cfg.masterPort == 65535);
  CHECK(cfg.masterPortGiven);
}

TEST_CASE("PET_MASTER_PORT counts as a given master port", "[cli]") {
  CleanPetEnv clean;
  ScopedEnv pet("PET_MASTER_PORT", "23456");
  auto cfg = parseRun({"/bin/true"});
  CHECK(cfg.masterPort == 23456);
  CHECK(cfg.masterPortGiven);
}

TEST_CASE("flag --max_restarts must not be negative", "[cli]") {
  CleanPetEnv clean;
  expectUsageError({"--max_restarts=-1", "/bin/true"}, "--max_restarts");
  expectUsageError({"--max_restarts", "-1", "/bin/true"});
  expectUsageError({"--max_restarts", "two", "/bin/true"}, "--max_restarts");
  CHECK(parseRun({"--max_restarts", "3", "/bin/true"}).maxRestarts == 3);
}

TEST_CASE("without --standalone: run id none, MASTER_ADDR 127.0.0.1, port 29500", "[cli]") {
  CleanPetEnv clean;
  auto cfg = parseRun({"/bin/true"});
  CHECK_FALSE(cfg.standalone);
  CHECK(cfg.runId == "none");
  CHECK(cfg.masterAddr == "127.0.0.1");
  CHECK(cfg.masterPort == 29500);
  CHECK_FALSE(cfg.masterPortGiven);
  CHECK(cfg.rdzvBackend == ddprun::RdzvBackend::kStatic);
  CHECK(cfg.maxRestarts == 0);
  CHECK(cfg.role == "default");
  CHECK(cfg.shutdownTimeoutSeconds == 30.0);
  CHECK(cfg.signalsToHandle == std::vector<int>{SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2});
}

TEST_CASE("flag --standalone: MASTER_ADDR localhost and a fresh uuid-like run id", "[cli]") {
  CleanPetEnv clean;
  auto first = parseRun({"--standalone", "/bin/true"});
  auto second = parseRun({"--standalone", "/bin/true"});
  CHECK(first.standalone);
  CHECK(first.masterAddr == "localhost");
  const std::regex uuid("[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}");
  CHECK(std::regex_match(first.runId, uuid));
  CHECK(std::regex_match(second.runId, uuid));
  CHECK(first.runId != second.runId);
  CHECK(first.minNodes == 1);
  CHECK(first.maxNodes == 1);
}

TEST_CASE("flag --standalone keeps a given run id", "[cli]") {
  CleanPetEnv clean;
  CHECK(parseRun({"--standalone", "--rdzv_id", "job42", "/bin/true"}).runId == "job42");
  CHECK(parseRun({"--rdzv-id=job43", "/bin/true"}).runId == "job43");
  CHECK(parseRun({"--run_id", "job44", "/bin/true"}).runId == "job44");
}

TEST_CASE("flag --local_addr becomes MASTER_ADDR", "[cli]") {
  CleanPetEnv clean;
  CHECK(parseRun({"--standalone", "--local_addr", "10.0.0.5", "/bin/true"}).masterAddr == "10.0.0.5");
  CHECK(parseRun({"--master_addr", "10.0.0.6", "/bin/true"}).masterAddr == "10.0.0.6");
}

TEST_CASE("flags -r and -t parse torchrun's stream specs", "[cli]") {
  CleanPetEnv clean;
  auto cfg = parseRun({"-r", "3", "-t", "0:1,1:2", "/bin/true"});
  CHECK(cfg.log.redirects.all == 3);
  CHECK(cfg.log.tee.all == 0);
  CHECK(cfg.log.tee.perRank == std::map<int, int>{{0, 1}, {1, 2}});
  cfg = parseRun({"--redirects", "2", "--tee=1", "/bin/true"});
  CHECK(cfg.log.redirects.all == 2);
  CHECK(cfg.log.tee.all == 1);
  expectUsageError({"-r", "4", "/bin/true"}, "--redirects");
  expectUsageError({"--tee", "1:x", "/bin/true"}, "--tee");
}

TEST_CASE("flags --local_ranks_filter and --log_line_prefix_template are checked", "[cli]") {
  CleanPetEnv clean;
  auto cfg = parseRun({"--local_ranks_filter", "0,2", "--log_line_prefix_template", "[{rank}]", "/bin/true"});
  CHECK(cfg.log.consoleRanks == std::set<int>{0, 2});
  CHECK(cfg.log.prefixTemplate == "[{rank}]");
  expectUsageError({"--local_ranks_filter", "a", "/bin/true"}, "--local_ranks_filter");
  expectUsageError({"--log_line_prefix_template", "{nope}", "/bin/true"}, "{nope}");
}

TEST_CASE("flag --signals_to_handle takes signal names", "[cli]") {
  CleanPetEnv clean;
  CHECK(parseRun({"--signals_to_handle", "SIGTERM,SIGUSR1", "/bin/true"}).signalsToHandle ==
        std::vector<int>{SIGTERM, SIGUSR1});
  CHECK(parseRun({"--signals-to-handle=TERM, HUP", "/bin/true"}).signalsToHandle == std::vector<int>{SIGTERM, SIGHUP});
  expectUsageError({"--signals_to_handle", "SIGTERM,SIGBOGUS", "/bin/true"}, "SIGBOGUS");
  expectUsageError({"--signals_to_handle", "SIGKILL", "/bin/true"}, "SIGKILL");
}

TEST_CASE("seconds flags and compatibility flags are checked", "[cli]") {
  CleanPetEnv clean;
  auto cfg = parseRun({"--shutdown_timeout", "2.5", "--monitor_interval", "1", "--start_method", "fork", "/bin/true"});
  CHECK(cfg.shutdownTimeoutSeconds == 2.5);
  CHECK(cfg.monitorIntervalSeconds == 1.0);
  expectUsageError({"--shutdown_timeout=-1", "/bin/true"}, "--shutdown_timeout");
  expectUsageError({"--monitor_interval", "fast", "/bin/true"}, "--monitor_interval");
  expectUsageError({"--start_method", "thread", "/bin/true"}, "--start_method");
}

TEST_CASE("flag --rdzv_backend accepts static, and grpc with c10d as an alias", "[cli]") {
  CleanPetEnv clean;
  auto cfg = parseRun({"--rdzv_backend", "c10d", "--rdzv_endpoint", "127.0.0.1:29401", "/bin/true"});
  CHECK(cfg.rdzvBackend == ddprun::RdzvBackend::kGrpc);
  CHECK(cfg.multiNode);
  CHECK(cfg.endpointHost == "127.0.0.1");
  CHECK(cfg.endpointPort == 29401);
  cfg = parseRun({"--rdzv-backend=grpc", "--rdzv-endpoint=127.0.0.1", "/bin/true"});
  CHECK(cfg.endpointPort == 29400);  // the default rendezvous port
  CHECK_FALSE(parseRun({"--rdzv_backend", "static", "/bin/true"}).multiNode);
  expectUsageError({"--rdzv_backend", "etcd-v3", "/bin/true"}, "--rdzv_backend");
  // No endpoint: torchrun's localhost:29400 for one node, refused for several (each node would
  // wait at its own localhost until the join timeout).
  cfg = parseRun({"--rdzv_backend", "c10d", "/bin/true"});
  CHECK(cfg.endpointHost == "localhost");
  CHECK(cfg.endpointPort == 29400);
  expectUsageError({"--rdzv_backend", "c10d", "--nnodes=1:2", "/bin/true"}, "--rdzv_endpoint");
}

TEST_CASE("static multi-node: node 0 hosts the rendezvous at MASTER_ADDR:MASTER_PORT", "[cli]") {
  CleanPetEnv clean;
  auto node0 = parseRun({"--nnodes", "2", "--node_rank", "0", "--master_addr", "127.0.0.1", "--master_port",
                         "29555", "/bin/true"});
  CHECK(node0.multiNode);
  CHECK(node0.minNodes == 2);
  CHECK(node0.maxNodes == 2);
  CHECK(node0.endpointHost == "127.0.0.1");
  CHECK(node0.endpointPort == 29555);
  CHECK(node0.isHost == std::optional<bool>(true));
  auto node1 = parseRun({"--nnodes=2", "--node-rank=1", "--master_addr", "127.0.0.1", "/bin/true"});
  CHECK(node1.nodeRank == 1);
  CHECK(node1.isHost == std::optional<bool>(false));
  CHECK(node1.endpointPort == 29500);
}

TEST_CASE("bad multi-node settings are usage errors", "[cli]") {
  CleanPetEnv clean;
  expectUsageError({"--node_rank", "1", "/bin/true"}, "--node_rank");  // only one node
  expectUsageError({"--nnodes", "2", "--node_rank", "2", "/bin/true"}, "--node_rank");
  expectUsageError({"--nnodes", "1:2", "/bin/true"}, "--nnodes");  // elastic needs grpc
}

TEST_CASE("flag --rdzv_conf takes torchrun's keys, and warns of an unknown one", "[cli]") {
  CleanPetEnv clean;
  auto cfg = parseRun({"--rdzv_conf", "join_timeout=60,last_call_timeout=2.5,heartbeat_timeout=3,timeout=9",
                       "/bin/true"});
  CHECK(cfg.joinTimeoutSeconds == 60.0);
  CHECK(cfg.lastCallTimeoutSeconds == 2.5);
  CHECK(cfg.heartbeatTimeoutSeconds == 3.0);
  // An unknown key is not an error (torchrun goes on too), but it is said, once.
  Parsed typo = parse({"--rdzv_conf", "bogus_key=1", "/bin/true"});
  CHECK(typo.result.kind == Kind::kRun);
  CHECK_THAT(typo.err, Catch::Contains("unknown key 'bogus_key' ignored"));
  expectUsageError({"--rdzv_conf", "join_timeout", "/bin/true"}, "--rdzv_conf");
  expectUsageError({"--rdzv_conf", "join_timeout=0", "/bin/true"}, "join_timeout");
}

TEST_CASE("switches and simple options reach the config", "[cli]") {
  CleanPetEnv clean;
  auto cfg = parseRun({"--role", "trainer", "--virtual_local_rank", "--dry-run", "--log_dir", "/tmp/logs",
                       "--log_level", "debug", "/bin/true"});
  CHECK(cfg.role == "trainer");
  CHECK(cfg.virtualLocalRank);
  CHECK(cfg.dryRun);
  CHECK(cfg.log.logDir == "/tmp/logs");
  CHECK(cfg.logLevel == "debug");
  expectUsageError({"--log_level", "chatty", "/bin/true"}, "chatty");
}

TEST_CASE("flag -m runs a module under the python on PATH", "[cli]") {
  CleanPetEnv clean;
  ddprun::test::TempDir bin;
  ddprun::test::writeFile(bin.file("python3"), "#!/bin/sh\n", 0755);
  ScopedEnv path("PATH", bin.path());
  ScopedEnv python("PYTHON_EXEC", std::nullopt);
  auto cfg = parseRun({"-m", "pkg.train", "--epochs", "3"});
  CHECK(cfg.module);
  CHECK(cfg.program == "pkg.train");
  CHECK(cfg.programArgs == std::vector<std::string>{"--epochs", "3"});
  CHECK(cfg.executable == bin.file("python3"));
  CHECK(cfg.execArgs == std::vector<std::string>{"-u", "-m", "pkg.train", "--epochs", "3"});
  expectUsageError({"-m", "--no_python", "pkg.train"}, "--no_python");
}

TEST_CASE("flag --legacy_local_rank puts --local_rank or --local-rank after the script, as torch.distributed.launch", "[cli]") {
  CleanPetEnv clean;
  ddprun::test::TempDir bin;
  ddprun::test::writeFile(bin.file("python3"), "#!/bin/sh\n", 0755);
  ScopedEnv path("PATH", bin.path());
  ScopedEnv python("PYTHON_EXEC", std::nullopt);
  auto none = parseRun({"-m", "pkg.train", "--epochs", "3"});
  CHECK(none.localRankArg.empty());
  auto module = parseRun({"--legacy_local_rank=underscore", "-m", "pkg.train", "--epochs", "3"});
  CHECK(module.localRankArg == "--local_rank");
  REQUIRE(module.localRankArgAt == 3);  // -u -m pkg.train | --epochs 3
  auto direct = parseRun({"--legacy-local-rank", "dash", "--no_python", "/bin/true", "x"});
  CHECK(direct.localRankArg == "--local-rank");
  CHECK(direct.localRankArgAt == 0);  // /bin/true is the executable: its args begin at once
  {
    ScopedEnv pet("PET_LEGACY_LOCAL_RANK", "dash");
    CHECK(parseRun({"/bin/true"}).localRankArg == "--local-rank");
  }
  expectUsageError({"--legacy_local_rank=yes", "/bin/true"}, "expected underscore or dash");
}

TEST_CASE("abbreviated flags work as in torchrun, an ambiguous one is a usage error, a repeated one takes the last value", "[cli]") {
  CleanPetEnv clean;
  auto cfg = parseRun({"--nproc-per", "3", "--max_re=2", "--role", "a", "--role", "b", "/bin/true", "--nproc-per"});
  CHECK(cfg.nprocPerNode == 3);
  CHECK(cfg.maxRestarts == 2);
  CHECK(cfg.role == "b");
  CHECK(cfg.programArgs == std::vector<std::string>{"--nproc-per"});  // the program's own
  expectUsageError({"--rdzv", "x", "/bin/true"}, "ambiguous option: --rdzv");
}

TEST_CASE("torchrun's own variables: TORCH_ELASTIC_SHUTDOWN_TIMEOUT and TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, below the flags", "[cli]") {
  CleanPetEnv clean;
  CHECK(parseRun({"/bin/true"}).shutdownTimeoutSeconds == 30);
  {
    ScopedEnv torch("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "7");
    CHECK(parseRun({"/bin/true"}).shutdownTimeoutSeconds == 7);
    CHECK(parseRun({"--shutdown_timeout=3", "/bin/true"}).shutdownTimeoutSeconds == 3);
    ScopedEnv pet("PET_SHUTDOWN_TIMEOUT", "5");
    CHECK(parseRun({"/bin/true"}).shutdownTimeoutSeconds == 5);
  }
  {
    ScopedEnv torch("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "1e300");
    expectUsageError({"/bin/true"}, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT");
  }
  ScopedEnv torchPrefix("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "${hostname}:${rank}: ");
  CHECK(parseRun({"/bin/true"}).log.prefixTemplate == "${hostname}:${rank}: ");
  CHECK(parseRun({"--log_line_prefix_template=X", "/bin/true"}).log.prefixTemplate == "X");
}

TEST_CASE("flag --print_completion prints a script naming every flag and exits 0", "[cli]") {
  CleanPetEnv clean;
  for (const char* shell : {"bash", "zsh", "tcsh"}) {
    INFO(shell);
    Parsed p = parse({"--print-completion", shell});
    CHECK(p.result.kind == Kind::kExit);
    CHECK(p.result.exitStatus == 0);
    CHECK_THAT(p.out, Catch::Contains("nproc_per_node") && Catch::Contains("nproc-per-node") &&
                          Catch::Contains("legacy_local_rank") && Catch::Contains("ddprun"));
  }
  expectUsageError({"--print_completion=fish"}, "expected bash, zsh or tcsh");
}

TEST_CASE("flags --help and --version exit 0 and print to stdout", "[cli]") {
  CleanPetEnv clean;
  Parsed help = parse({"--help"});
  CHECK(help.result.kind == Kind::kExit);
  CHECK(help.result.exitStatus == 0);
  CHECK_THAT(help.out, Catch::Contains("--nproc_per_node"));
  CHECK(help.err.empty());

  Parsed version = parse({"--version"});
  CHECK(version.result.kind == Kind::kExit);
  CHECK(version.result.exitStatus == 0);
  CHECK_THAT(version.out, Catch::Contains("ddprun"));

  Parsed shortHelp = parse({"-h", "/bin/true"});
  CHECK(shortHelp.result.kind == Kind::kExit);
  CHECK(shortHelp.result.exitStatus == 0);
}
