// The agent's TCPStore: torch's store protocol (store/tcpstore/) on 127.0.0.1 for this node's
// workers, who find it at MASTER_ADDR:MASTER_PORT with TORCHELASTIC_USE_AGENT_STORE=True, as under
// torchrun's agent store. The store then outlives every rank, rank 0 included (DESIGN.md section 10).
//
// Where the keys live: on one node, in a StoreCore of this process (every rank of the job is here);
// across nodes, in the job's store (the rendezvous server's, or a daemon's), reached through the
// sinks `sinksFor` gives (store/forward/: the token-bearing store framing), so that the ranks of
// every node share one store with libddp's workers and ddprun's tools.
//
// Admission: TCPStore's protocol carries no credential, and a token cannot ride in a first key
// (torch fixes the first operations). So the port listens on loopback only, and a connection is
// admitted only when the process at its other end is one of the job's on this node: a worker of
// the current attempt or a process below one (agent/socket_peer.h asks the kernel which process
// holds the peer socket). Anything else is closed unread and logged. README, "Security".
//
// Fencing: a connection is bound to the round that was current when it was admitted. On one node
// the core answers only the current round; across nodes the job's store does. A connection of an
// old round fails at its next request (closed: the protocol has no error reply), and a key of the
// new round is never visible to it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "rendezvous/rules/node_view.h"
#include "store/core/store_request_sink.h"
#include "store/tcpstore/tcpstore_server.h"

namespace ddprun {

class SocketPeerFinder;

struct TorchStoreOptions {
  // 127.0.0.1:port; 0: a free port, kept for the agent's life (every restart sees the same).
  int port = 0;
  // The sinks of a round's connections when the keys live elsewhere (called on the agent's thread
  // at each round, never under a lock of the TorchStore); unset: a StoreCore in this process.
  std::function<StoreRequestSink::Factory(const RoundInfo& round)> sinksFor;
  // Who holds a connection's other end; null: the kernel's answer (ProcSocketPeerFinder).
  std::shared_ptr<SocketPeerFinder> peers;
  // How long a connection may wait for admission while an attempt's workers are being started (a
  // worker can connect before the agent has their process ids).
  std::chrono::milliseconds spawnWait{2000};
  std::size_t maxConnections = 4096;
};

class TorchStore {
 public:
  // Listens. Throws ConfigError when the port cannot be bound (in use: say --master_port).
  explicit TorchStore(TorchStoreOptions options);
  ~TorchStore();  // stop()
  TorchStore(const TorchStore&) = delete;
  TorchStore& operator=(const TorchStore&) = delete;

  // What the workers are given as MASTER_ADDR and MASTER_PORT.
  static constexpr const char* kAddress = "127.0.0.1";
  int port() const { return port_; }

  // A new round's workers are about to start: connections admitted from now on use its scope, and
  // wait (up to spawnWait) for admit() before they are judged. The previous round's keys are
  // dropped on one node.
  void beginRound(const std::string& runId, const RoundInfo& round);
  // The processes whose connections are admitted: the attempt's workers (their descendants too).
  // Empty: none (the group stopped).
  void admit(std::vector<pid_t> workers);
  // Stops accepting and closes every connection. Idempotent.
  void stop();
  TcpStoreServerStats stats() const;
  // Connections refused because no process of the job held them.
  uint64_t refusedStrangers() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace ddprun
