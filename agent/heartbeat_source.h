// Where the workers' heartbeats come from (docs/heartbeat.md): one channel per worker and
// attempt. SocketHeartbeatSource is the real one (a socket pair per worker, plus the named socket
// that old workers and processes that did not inherit their end use); tests of agent logic use
// FakeHeartbeatSource (tests/unit), as they use FakeProcessSupervisor. The agent decides what a
// beat means (agent/hang_detector.h); a source only delivers parsed ones.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/heartbeat_message.h"

namespace ddprun {

// What one worker gets of its channel: variables for its environment, and the fd it inherits.
struct WorkerChannelEnd {
  int fd = -1;  // kept open in the worker at this number (SpawnRequest::inheritFd); -1: none
  std::vector<std::pair<std::string, std::string>> env;  // DDPRUN_HEARTBEAT_FD, DDPRUN_HEARTBEAT_SOCKET
};

class HeartbeatSource {
 public:
  // Called on the event loop, for every well-formed beat of the current attempt.
  using OnBeat = std::function<void(const HeartbeatMessage&)>;

  virtual ~HeartbeatSource() = default;
  virtual void setOnBeat(OnBeat onBeat) = 0;
  // A new attempt: the previous attempt's channels are closed and what they queued is dropped, but
  // for those under `keep` (warm spares', which outlive the attempt they waited through).
  virtual void newAttempt(const std::vector<int>& keep) = 0;
  // The channel of one worker of the current attempt, before it is spawned.
  virtual WorkerChannelEnd openChannel(int localRank) = 0;
  // The attempt's workers were spawned: the agent's copies of their ends are closed (so that a
  // worker's end closes when the worker's process tree does).
  virtual void workersSpawned() = 0;
  // Delivers everything queued now, before a decision that depends on the latest beats.
  virtual void drain() = 0;

  // In-process recovery (DESIGN.md section 11): the channels of the workers that live on stay
  // open across rounds; one replaced worker gets a new channel (its old one is closed) ...
  virtual WorkerChannelEnd reopenChannel(int localRank) { return openChannel(localRank); }
  // ... whose worker end the agent closes once that worker is spawned ...
  virtual void workerSpawned(int localRank) { (void)localRank; }
  // ... and a live worker is told its next round on its channel (docs/heartbeat.md, "Notices").
  // False when the message could not be queued (no channel, the worker's end is gone, full).
  virtual bool sendToWorker(int localRank, const std::string& message) {
    (void)localRank, (void)message;
    return false;
  }
  // A warm spare's channel (opened under a key of its own) becomes local rank `to`'s: the spare
  // now is that rank. The channel that `to` had is closed.
  virtual void moveChannel(int from, int to) { (void)from, (void)to; }
};

}  // namespace ddprun
