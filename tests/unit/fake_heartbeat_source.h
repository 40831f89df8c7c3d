// A HeartbeatSource without sockets, for tests of the agent's logic: the test says when a worker
// beats (beat()), and sees which channels the agent opened for which attempt.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "agent/heartbeat_source.h"

namespace ddprun::test {

class FakeHeartbeatSource final : public HeartbeatSource {
 public:
  void setOnBeat(OnBeat onBeat) override { onBeat_ = std::move(onBeat); }
  void newAttempt(const std::vector<int>& keep) override {
    ++attempts;
    opened.clear();
    kept = keep;
  }
  WorkerChannelEnd openChannel(int localRank) override {
    opened.push_back(localRank);
    return WorkerChannelEnd{-1, {{"DDPRUN_HEARTBEAT_SOCKET", "@fake-heartbeats"}}};
  }
  void workersSpawned() override { ++spawnedCalls; }
  void drain() override { ++drains; }
  WorkerChannelEnd reopenChannel(int localRank) override {
    reopened.push_back(localRank);
    return openChannel(localRank);
  }
  void moveChannel(int from, int to) override { moved.emplace_back(from, to); }
  bool sendToWorker(int localRank, const std::string& message) override {
    sent.emplace_back(localRank, message);
    return true;
  }

  // A worker of the current attempt beats (delivered at once, as the real source does on the loop).
  void beat(int rank, int64_t step, std::string section = {}, std::optional<double> seconds = std::nullopt,
            bool recoverable = false) {
    if (onBeat_) onBeat_(HeartbeatMessage{rank, step, std::move(section), seconds, recoverable});
  }

  int attempts = 0;
  int spawnedCalls = 0;
  int drains = 0;
  std::vector<int> kept;    // the channels the last newAttempt kept open (warm spares')
  std::vector<int> opened;  // local ranks whose channel the current attempt opened
  std::vector<int> reopened;  // local ranks given a new channel by an in-process recovery
  std::vector<std::pair<int, std::string>> sent;  // notices to live workers, by local rank
  std::vector<std::pair<int, int>> moved;          // a spare's channel that became a rank's

 private:
  OnBeat onBeat_;
};

}  // namespace ddprun::test
