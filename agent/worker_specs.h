// What each worker of an attempt is started with, and where its files go: the run folder's layout
// (attempt_N/<local rank>/NAME as torchrun's, or flat in ddprun's own temporary folder), torchrun's
// environment, the heartbeat channel, the log routing. Creates the folders and removes the stale
// files of an earlier run; nothing else of the agent's state.
#pragma once

#include <functional>
#include <vector>

#include "agent/elastic_agent.h"
#include "agent/worker_group.h"

namespace ddprun {

class WorkerSpecs {
 public:
  // `options` must outlive this.
  explicit WorkerSpecs(const AgentOptions& options) : options_(options) {}

  // Single node (no store address): the round's store is a folder (the SDK's file store), created
  // empty, so that a restarted group starts from nothing; sets round.storeAddr and storePrefix.
  // Throws ConfigError when it cannot be created.
  void placeFileStore(RoundInfo& round) const;
  // One spec per local rank; `channel` opens each worker's heartbeat channel (null: none).
  // Throws ConfigError when a folder cannot be created.
  std::vector<WorkerSpec> make(const RoundInfo& round, const std::function<WorkerChannelEnd(int)>& channel) const;

 private:
  const AgentOptions& options_;
};

}  // namespace ddprun
