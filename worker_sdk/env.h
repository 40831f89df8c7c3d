// The worker's view of its job: torchrun's environment contract plus ddprun's own variables,
// parsed once and checked, so that a broken launch fails at start with a message naming the
// variable instead of hanging in the first collective.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace ddp {

struct Env {
  int rank = 0;             // RANK: global rank, 0 <= rank < worldSize
  int localRank = 0;        // LOCAL_RANK: rank on this node (0 with --virtual_local_rank)
  int worldSize = 1;        // WORLD_SIZE
  int localWorldSize = 1;   // LOCAL_WORLD_SIZE
  int groupRank = 0;        // GROUP_RANK: this node's rank
  int groupWorldSize = 1;   // GROUP_WORLD_SIZE: nodes in the job
  std::string masterAddr;   // MASTER_ADDR: where PyTorch's rank 0 hosts its TCPStore
  int masterPort = 0;       // MASTER_PORT
  int restartCount = 0;     // TORCHELASTIC_RESTART_COUNT (0 when unset)
  uint64_t round = 0;       // DDPRUN_ROUND, else the round in DDPRUN_STORE_PREFIX, else 0
  std::string runId;        // DDPRUN_RUN_ID, else TORCHELASTIC_RUN_ID, else the id in the prefix
  std::string storeAddr;    // DDPRUN_STORE_ADDR: host:port of the job's store; empty when none
  std::string storePrefix;  // DDPRUN_STORE_PREFIX: "/run/<id>/round/<n>/"; empty when none
  std::string token;        // the job token: the file DDPRUN_RDZV_TOKEN_FILE, else DDPRUN_RDZV_TOKEN
  // The store on etcd (DDPRUN_STORE_ADDR=etcd://...; docs/etcd.md): the key root every job's keys
  // live under (DDPRUN_ETCD_PREFIX, "/ddprun" when unset), TLS files (DDPRUN_ETCD_CACERT,
  // DDPRUN_ETCD_CERT, DDPRUN_ETCD_KEY) and a file of "user:password" (DDPRUN_ETCD_AUTH_FILE).
  std::string etcdPrefix = "/ddprun";
  std::string etcdCaCert, etcdCert, etcdKey, etcdAuthFile;
  // TLS to the job's store on ddprun's rendezvous server (--rdzv_conf protocol=https): on with
  // DDPRUN_STORE_TLS=1; the CA, and this node's certificate and key for mTLS, by path
  // (DDPRUN_STORE_TLS_CACERT, DDPRUN_STORE_TLS_CERT, DDPRUN_STORE_TLS_KEY).
  bool storeTls = false;
  std::string storeTlsCaCert, storeTlsCert, storeTlsKey;
  // The channel to the agent (docs/heartbeat.md): the inherited end (DDPRUN_HEARTBEAT_FD; -1:
  // none), and the socket for a process that did not inherit it (DDPRUN_HEARTBEAT_SOCKET; empty:
  // none).
  int heartbeatFd = -1;
  std::string heartbeatSocket;
  std::string cudaVisibleDevices;  // CUDA_VISIBLE_DEVICES as given; empty when unset
  std::string glooSocketIfname;    // GLOO_SOCKET_IFNAME, as PyTorch reads it; empty when unset

  // Reads this process's environment. Throws ddprun::ConfigError naming the first variable that
  // is missing, not a non-negative decimal integer, out of range (RANK >= WORLD_SIZE,
  // LOCAL_RANK >= LOCAL_WORLD_SIZE, ...) or inconsistent with another (DDPRUN_STORE_PREFIX
  // against DDPRUN_ROUND and the run id), and an unreadable or empty token file.
  static Env fromEnviron();
  // The same from a map, for tests and for programs that build their own environment.
  static Env fromEnvironment(const std::map<std::string, std::string>& vars);
};

}  // namespace ddp
