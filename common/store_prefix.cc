#include "common/store_prefix.h"

namespace ddprun {

std::string runPrefix(std::string_view runId) {
  std::string out = "/run/";
  out.append(runId);
  out += '/';
  return out;
}

std::string storeRoundsPrefix(std::string_view runId) { return runPrefix(runId) + "round/"; }

std::string storePrefix(std::string_view runId, uint64_t round) {
  return storeRoundsPrefix(runId) + std::to_string(round) + "/";
}

}  // namespace ddprun
