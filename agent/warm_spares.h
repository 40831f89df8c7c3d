// --spares_per_node (in-process recovery, DESIGN.md section 11): one node's warm spares, processes
// that ran the script up to ddprun.recovery's entry and wait there, not ranks. Each has a heartbeat
// channel under a key of its own; when one becomes a rank, its channel becomes the rank's and it is
// told who it is. While the node waits long for its first round (a standby node), its ranks'
// processes wait as spares too, so that the round starts them warm. Used on the agent's event loop.
#pragma once

#include <sys/types.h>

#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "agent/worker_group.h"

namespace ddprun {

class HeartbeatSource;
class WorkerSpecs;
struct RoundInfo;

class WarmSpares {
 public:
  using Contract = std::vector<std::pair<std::string, std::string>>;

  // `specs` and `heartbeats` (null: none) must outlive this. `perNode`: --spares_per_node (0: none,
  // and startGroup only starts the group).
  WarmSpares(boost::asio::io_context& io, ProcessSupervisor& supervisor, const WorkerSpecs& specs,
             HeartbeatSource* heartbeats, int nproc, int perNode, std::chrono::milliseconds warmStartAfter);
  ~WarmSpares();

  // Once the node has waited `warmStartAfter` for its first round and `stillWaiting()` holds then,
  // starts its nproc ranks' processes and its spares, to wait as spares. Nothing when perNode is 0.
  void waitForFirstRound(std::function<bool()> stillWaiting);
  // The exit of a process started while waiting (false: not one of them).
  bool handleExit(const ProcessExit& exit);
  // Whether processes wait for the first round (startGroup then needs the ranks' contracts).
  bool waiting() const { return waiting_ != nullptr; }
  // Their channels' keys: the next attempt keeps them open (HeartbeatSource::newAttempt).
  std::vector<int> waitingKeys() const;
  // The node stops: no more waiting, and those waiting are SIGKILLed (nothing of theirs to save).
  void stopWaiting();

  // Starts `group`: its ranks take the processes that waited (each told its rank in `round` and the
  // rest of its contract, `contracts` by local rank), else new processes; then the group's spares
  // are topped up to perNode.
  void startGroup(WorkerGroup& group, const RoundInfo& round, const std::vector<Contract>& contracts);
  // One more spare of `group`.
  void add(WorkerGroup& group, const RoundInfo& round);
  // The spare `pid` became local rank `localRank` of `round`: its channel is the rank's from now on,
  // and it is told so. False (logged) when it could not be told.
  bool tell(const RoundInfo& round, int localRank, pid_t pid, const Contract& contract, const std::string& reason);

 private:
  static constexpr int kKeyBase = 1 << 20;  // spares' channel keys, apart from local ranks

  boost::asio::io_context& io_;
  ProcessSupervisor& supervisor_;
  const WorkerSpecs& specs_;
  HeartbeatSource* heartbeats_;
  int nproc_;
  int perNode_;
  std::chrono::milliseconds warmStartAfter_;
  boost::asio::steady_timer timer_;
  int serial_ = 0;
  std::map<pid_t, int> keys_;             // a running spare's channel key, by pid
  std::unique_ptr<WorkerGroup> waiting_;  // started while waiting for the first round
};

}  // namespace ddprun
