#include "agent/in_process_recovery.h"

#include "common/strings.h"

namespace ddprun {

std::string InProcessRecovery::notice(const RoundInfo& round, int localRank, const std::string& reason,
                                      const std::vector<std::pair<std::string, std::string>>& env) {
  // The worker reads this (python/ddprun/recovery.py); at most 1024 bytes, the reason last.
  std::string out = "recover round=" + std::to_string(round.round) + " restart=" + std::to_string(round.restartCount) +
                    " rank=" + std::to_string(round.rankOffset + localRank) +
                    " world=" + std::to_string(round.worldSize) + " local_rank=" + std::to_string(localRank) +
                    " master_addr=" + round.masterAddr + " master_port=" + std::to_string(round.masterPort);
  // ddprun's own store for the round (libddp's workers build their next communicator on it),
  // then, for a spare, the rest of its contract.
  std::vector<std::pair<std::string, std::string>> all;
  if (!round.storeAddr.empty()) {
    all.emplace_back("DDPRUN_STORE_ADDR", round.storeAddr);
    all.emplace_back("DDPRUN_STORE_PREFIX", round.storePrefix);
  }
  all.insert(all.end(), env.begin(), env.end());
  for (const auto& [name, value] : all) {
    if (value.find_first_of(" \t\r\n") != std::string::npos || value.size() > 256) continue;
    out += " env." + name + "=" + value;
  }
  out += " reason=";
  out += printable(reason, 160);  // escaped bytes take 4: at most about 700 of the 1024
  return out.substr(0, 1024);
}

}  // namespace ddprun
