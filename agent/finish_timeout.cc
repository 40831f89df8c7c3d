#include "agent/finish_timeout.h"

#include <fmt/format.h>

#include <algorithm>

namespace ddprun {

std::string formatSeconds(std::chrono::milliseconds d) {
  return fmt::format("{:.1f}s", static_cast<double>(d.count()) / 1000.0);
}

bool FinishTimeout::rankFinished(int rank) {
  finishedRanks_.insert(rank);
  const bool first = !reported_;
  reported_ = true;
  return first;
}

void FinishTimeout::peerFinished(int rank, const std::string& node) {
  if (!peer_) peer_ = Peer{rank, node};
}

bool FinishTimeout::start(Clock::time_point now) {
  if (bound_.count() <= 0 || started_) return false;
  started_ = true;
  startedAt_ = now;
  return true;
}

FinishTimeout::Verdict FinishTimeout::check(const std::vector<Running>& running, Clock::time_point now) const {
  Verdict verdict;
  verdict.nextCheck = bound_;
  for (const auto& r : running) {
    if (r.silentFor && *r.silentFor < bound_) {
      verdict.nextCheck = std::min(verdict.nextCheck, bound_ - *r.silentFor);
      continue;
    }
    verdict.hung.push_back(r.localRank);
  }
  if (verdict.hung.empty()) return verdict;
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - startedAt_);
  std::string finished;
  for (int rank : finishedRanks_) finished += (finished.empty() ? "" : ", ") + ("rank " + std::to_string(rank));
  if (peer_ && !finishedRanks_.count(peer_->rank)) {
    finished += (finished.empty() ? "" : ", ") + ("rank " + std::to_string(peer_->rank)) +
                (peer_->node.empty() ? "" : " (node " + peer_->node + ")");
  }
  std::string stillRunning;
  for (const auto& r : running) {
    if (std::find(verdict.hung.begin(), verdict.hung.end(), r.localRank) == verdict.hung.end()) continue;
    stillRunning += (stillRunning.empty() ? "" : ", ") + ("rank " + std::to_string(r.rank));
  }
  const std::string seconds = formatSeconds(waited);
  verdict.diagnosis =
      "job hung at its end: finished: " + finished + "; still running: " + stillRunning + ", " + seconds +
      " after the first rank finished (--finish_timeout=" + formatSeconds(bound_) +
      "). This usually means uneven inputs: some ranks ran out of data and exited while the others "
      "wait in a collective for them. Give every rank the same number of batches (DistributedSampler "
      "with drop_last=True), or let ranks that finish early shadow the others' collectives with "
      "torch.distributed.algorithms.Join. A rank whose epilogue outlasts the bound should call "
      "ddprun.heartbeat() in it, or raise --finish_timeout.";
  verdict.hangNote = "still running " + seconds + " after " + (finished.empty() ? "a rank" : finished) +
                     " finished (--finish_timeout)";
  return verdict;
}

}  // namespace ddprun
