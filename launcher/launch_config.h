// Everything the command line asked for, validated. Built by parseCommandLine (cli.h).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/metrics_port.h"
#include "agent/log_options.h"

namespace ddprun {

// --rdzv_backend. Static is not an algorithm of its own: node 0 hosts the grpc backend at
// --master_addr:--master_port and the group rank is --node_rank (launcher/backend/).
enum class RdzvBackend { kStatic, kGrpc, kEtcd };
// "static", "grpc" or "etcd": for messages and the event log.
const char* backendName(RdzvBackend backend);

struct LaunchConfig {
  // Workers
  int nprocPerNode = 1;
  std::string role = "default";
  bool virtualLocalRank = false;

  // Nodes and rendezvous
  int minNodes = 1;
  int maxNodes = 1;
  int nodeRank = 0;
  bool standalone = false;
  RdzvBackend rdzvBackend = RdzvBackend::kStatic;
  std::string rdzvEndpoint;
  std::string rdzvConf;
  std::string runId = "none";
  std::string masterAddr = "127.0.0.1";
  int masterPort = 29500;
  bool masterPortGiven = false;
  std::string localAddr;
  // From --rdzv_conf (seconds), as torchrun's keys.
  double joinTimeoutSeconds = 600;
  double lastCallTimeoutSeconds = 30;
  double heartbeatTimeoutSeconds = 5;
  // torch's close_timeout: how long an agent that hosts the rendezvous waits, after its own end,
  // for the other agents to read the end of the job before its server stops.
  double closeTimeoutSeconds = 2;
  std::optional<bool> isHost;          // unset: host when the endpoint is a free local address
  std::string tokenFile;               // else DDPRUN_RDZV_TOKEN
  // TLS, torch's etcd keys for both backends (README "Security"): protocol=https, cacert (the CA
  // the server must chain to), cert and key (this node's, for mTLS); for the gRPC backend an agent
  // that hosts the rendezvous serves with server_cert and server_key, and asks the others for a
  // certificate signed by cacert when it has one itself (cert).
  bool tls = false;
  std::string tlsCaCert, tlsCert, tlsKey, tlsServerCert, tlsServerKey;
  // --rdzv_backend=etcd (docs/etcd.md): etcd_prefix, and etcd's user and password from a file
  // (auth_file, "USER:PASSWORD").
  std::string etcdAuthFile;
  std::string etcdPrefix = "/ddprun";
  // Multi-node: the rendezvous (a grpc server, or the first etcd member) at
  // endpointHost:endpointPort. Single node: a local one.
  bool multiNode = false;
  std::string endpointHost;
  int endpointPort = 0;
  // Inside an srun step (launcher/scheduler/slurm_env.h): the step's nodes in node-rank order and
  // a line naming the step, for --dry_run; empty otherwise.
  std::vector<std::string> slurmHosts;
  std::string slurmStep;

  // --torch_store: the agent serves torch's store for its workers (agent/torch_store.h), or rank 0
  // hosts its own TCPStore (kRank0, torchrun's default mode). auto: the agent, on every backend
  // (on etcd it runs torch's requests on the job's keys in etcd: store/forward/etcd_forwarding.h).
  enum class TorchStoreMode { kAuto, kAgent, kRank0 } torchStore = TorchStoreMode::kAuto;
  // --recovery=in_process: replace only a failed rank (AgentOptions::recovery).
  bool recoverInProcess = false;
  int sparesPerNode = 0;  // --spares_per_node
  // Whether the agent serves torch's store.
  bool agentTorchStore() const {
    return torchStore != TorchStoreMode::kRank0;
  }

  // Supervision
  int maxRestarts = 0;
  double monitorIntervalSeconds = 0.1;  // accepted for compatibility; exits are event-driven
  double shutdownTimeoutSeconds = 30;
  double hangTimeoutSeconds = 0;  // 0 = off
  bool hangTimeoutAuto = false;   // --hang_timeout=auto: learned from the heartbeats
  // Once a rank exited 0, the others must exit within this (job-wide); 0 = off. The default is
  // README "When a job hangs".
  double finishTimeoutSeconds = 300;
  int stopWithoutProgress = 0;
  int excludeNodeAfter = 0;     // a rule of the job (RendezvousRules): failures that exclude a host  // K restarts in a row without progress end the job; 0 = off
  std::vector<int> signalsToHandle;
  std::string signalsToHandleText;  // as given: workers get it as TORCHELASTIC_SIGNALS_TO_HANDLE

  // Logs
  LogOptions log;
  std::string logLevel = "warning";
  std::string eventLogHandler = "null";  // "null" or "console" (JSON lines on stderr)
  std::string timeline;                  // --timeline FILE: this node's events as JSON lines
  MetricsPortOptions metrics;            // --metrics_port (-1: none), --metrics_bind

  // CPU placement (--numa-binding)
  std::string numaBinding;               // "", node, socket, exclusive, core-complex
  std::vector<std::vector<int>> workerCpus;  // its CPUs per local rank; empty: no binding

  // The program
  std::string program;                 // as typed
  std::vector<std::string> programArgs;
  bool module = false;
  bool noPython = false;
  bool runPath = false;                // torchrun's --run_path: runpy.run_path(PROGRAM)
  std::string executable;              // resolved absolute path of what is exec'd
  std::vector<std::string> execArgs;   // argv[1..] of what is exec'd
  // --legacy_local_rank: "--local_rank" or "--local-rank" inserted as "<flag>=N" into execArgs at
  // localRankArgAt (after the script or module, before its arguments); empty: none.
  std::string localRankArg;
  std::size_t localRankArgAt = 0;

  bool dryRun = false;
};

}  // namespace ddprun
