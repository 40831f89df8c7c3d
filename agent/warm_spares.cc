#include "agent/warm_spares.h"

#include <spdlog/spdlog.h>

#include "agent/heartbeat_source.h"
#include "agent/in_process_recovery.h"
#include "agent/worker_specs.h"

namespace ddprun {

WarmSpares::WarmSpares(boost::asio::io_context& io, ProcessSupervisor& supervisor, const WorkerSpecs& specs,
                       HeartbeatSource* heartbeats, int nproc, int perNode, std::chrono::milliseconds warmStartAfter)
    : io_(io), supervisor_(supervisor), specs_(specs), heartbeats_(heartbeats), nproc_(nproc), perNode_(perNode),
      warmStartAfter_(warmStartAfter), timer_(io) {}

WarmSpares::~WarmSpares() { timer_.cancel(); }

void WarmSpares::waitForFirstRound(std::function<bool()> stillWaiting) {
  if (perNode_ <= 0) return;
  timer_.expires_after(warmStartAfter_);
  timer_.async_wait([this, stillWaiting = std::move(stillWaiting)](const boost::system::error_code& ec) {
    if (ec || !stillWaiting()) return;
    waiting_ = std::make_unique<WorkerGroup>(io_, supervisor_, std::vector<WorkerSpec>{}, WorkerGroupEvents{});
    for (int i = 0; i < nproc_ + perNode_; ++i) add(*waiting_, RoundInfo{});
    spdlog::info("started {} warm process(es) while waiting for a round", waiting_->spares());
  });
}

bool WarmSpares::handleExit(const ProcessExit& exit) { return waiting_ && waiting_->handleExit(exit); }

std::vector<int> WarmSpares::waitingKeys() const {
  std::vector<int> keys;
  if (!waiting_) return keys;
  for (pid_t pid : waiting_->pids()) {
    if (auto it = keys_.find(pid); it != keys_.end()) keys.push_back(it->second);
  }
  return keys;
}

void WarmSpares::stopWaiting() {
  timer_.cancel();
  if (waiting_) waiting_->killNow();
}

void WarmSpares::startGroup(WorkerGroup& group, const RoundInfo& round, const std::vector<Contract>& contracts) {
  timer_.cancel();
  std::vector<pid_t> taken;
  if (waiting_) {
    taken = group.startWithSpares(*waiting_);
    waiting_.reset();
  } else {
    group.start();
  }
  if (heartbeats_) heartbeats_->workersSpawned();
  for (std::size_t lr = 0; lr < taken.size() && lr < contracts.size(); ++lr) {
    if (taken[lr] <= 0) continue;
    const int localRank = static_cast<int>(lr);
    tell(round, localRank, taken[lr], contracts[lr],
         "a warm spare starts as rank " + std::to_string(round.rankOffset + localRank));
  }
  for (auto have = static_cast<int>(group.spares()); have < perNode_; ++have) add(group, round);
}

void WarmSpares::add(WorkerGroup& group, const RoundInfo& round) {
  const int key = kKeyBase + serial_++;
  std::function<WorkerChannelEnd(int)> channel;
  if (heartbeats_) channel = [this](int k) { return heartbeats_->reopenChannel(k); };
  const pid_t pid = group.addSpare(specs_.makeSpare(round, key, channel));
  if (heartbeats_) heartbeats_->workerSpawned(key);
  if (pid > 0) keys_[pid] = key;
}

bool WarmSpares::tell(const RoundInfo& round, int localRank, pid_t pid, const Contract& contract,
                      const std::string& reason) {
  auto key = keys_.find(pid);
  if (key == keys_.end() || !heartbeats_) return false;
  heartbeats_->moveChannel(key->second, localRank);
  keys_.erase(key);
  if (heartbeats_->sendToWorker(localRank, InProcessRecovery::notice(round, localRank, reason, contract))) return true;
  spdlog::warn("could not tell the spare (pid {}) that it is rank {}", pid, round.rankOffset + localRank);
  return false;
}

}  // namespace ddprun
