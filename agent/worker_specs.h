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
  // A warm spare (--spares_per_node): the program and the node's environment, but none of a rank's
  // own variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...: it is no rank until the agent
  // makes it one), DDPRUN_SPARE=1, its channel under `key`, "[spare<key>]:" before its lines, no
  // files of its own.
  WorkerSpec makeSpare(const RoundInfo& round, int key, const std::function<WorkerChannelEnd(int)>& channel) const;
  // What a spare that becomes local rank `localRank` is told of the rest of its contract.
  static std::vector<std::pair<std::string, std::string>> spareContract(const WorkerSpec& rankSpec);

 private:
  const AgentOptions& options_;
};

}  // namespace ddprun
