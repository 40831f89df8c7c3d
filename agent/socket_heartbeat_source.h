// The real HeartbeatSource (docs/heartbeat.md): per worker and attempt a SOCK_SEQPACKET socket
// pair, the worker's end inherited (DDPRUN_HEARTBEAT_FD), the agent's end read on the event loop;
// two-way, so that the agent can answer a live worker later (in-process recovery adds message
// types, not a transport). Beside them one abstract-namespace datagram socket
// (DDPRUN_HEARTBEAT_SOCKET) for workers of an older libddp or Python package and for processes
// that did not inherit the fd (a child started with close_fds). Both carry the same grammar.
#pragma once

#include <memory>
#include <string>

#include "agent/heartbeat_source.h"

namespace boost::asio {
class io_context;
}

namespace ddprun {

class SocketHeartbeatSource final : public HeartbeatSource {
 public:
  // Binds the named socket. Throws SystemError.
  explicit SocketHeartbeatSource(boost::asio::io_context& io);
  ~SocketHeartbeatSource() override;

  // The named socket, "@" + its abstract name.
  const std::string& socketName() const;

  void setOnBeat(OnBeat onBeat) override;
  void newAttempt(const std::vector<int>& keep) override;
  WorkerChannelEnd openChannel(int localRank) override;
  void workersSpawned() override;
  void drain() override;
  WorkerChannelEnd reopenChannel(int localRank) override;
  void workerSpawned(int localRank) override;
  bool sendToWorker(int localRank, const std::string& message) override;
  void moveChannel(int from, int to) override;

 private:
  class Impl;
  std::shared_ptr<Impl> impl_;  // shared with pending handlers
};

}  // namespace ddprun
