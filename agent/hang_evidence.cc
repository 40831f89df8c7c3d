#include "agent/hang_evidence.h"

#include <signal.h>
#include <spdlog/spdlog.h>

#include "agent/hang_attribution.h"
#include "agent/stack_dump.h"

namespace ddprun {

namespace {

void addDiagnosis(Attempt& attempt, const std::string& text) {
  attempt.diagnosis = attempt.diagnosis.empty() ? text : attempt.diagnosis + "\n" + text;
}

// Python ranks: the first to go silent may be one that waits for the rank behind (it beat last
// just before entering the collective). Their stacks can tell which is behind; the verdict already
// given stands, and the report says so.
void attributeFromStacks(Attempt& attempt) {
  if (!attempt.firstFailure || attempt.firstFailure->hangNote.empty() || attempt.recorderAttributed) return;
  std::vector<RankStackLines> ranks;
  for (const auto& stack : attempt.stacks) ranks.push_back(RankStackLines{stack.rank, stack.lines});
  const HangAttribution found = ddprun::attributeFromStacks(ranks);
  if (found.behind.size() != 1 || found.behind[0] == attempt.firstFailure->rank) return;
  const std::string text = "stacks: " + found.line + " (rank " + std::to_string(attempt.firstFailure->rank) +
                           ", the first to go silent, waits for it)";
  spdlog::warn("{}", text);
  addDiagnosis(attempt, text);
}

}  // namespace

WorkerExit blameFromFlightRecorders(const WorkerGroup& group, Attempt& attempt, int nprocPerNode, WorkerExit exit) {
  const int offset = attempt.round.rankOffset;
  std::vector<RankCollectives> ranks;
  for (int localRank = 0; localRank < nprocPerNode; ++localRank) {
    auto records = readFlightRecorder(group.spec(localRank).flightRecorder);
    if (records) ranks.push_back(RankCollectives{offset + localRank, std::move(*records)});
  }
  const HangAttribution found = attributeHang(ranks);
  attempt.recorderAttributed = !found.line.empty() && !found.behind.empty();
  if (found.line.empty()) return exit;
  spdlog::warn("flight recorder: {}", found.line);
  std::string text = "flight recorder: " + found.line;
  for (const auto& rank : ranks) text += "\n  " + describeRecent(rank);
  addDiagnosis(attempt, text);
  // The first to go silent may be one that waits for the rank behind: blame that one when it is
  // here and still runs.
  if (found.behind.size() != 1 || found.behind[0] == exit.rank) return exit;
  const int localRank = found.behind[0] - offset;
  if (localRank < 0 || localRank >= nprocPerNode || !group.running(localRank)) return exit;
  exit.hangNote = "never started the collective that rank " + std::to_string(exit.rank) + " waits in (rank " +
                  std::to_string(exit.rank) + ": " + exit.hangNote + ")";
  exit.rank = found.behind[0];
  exit.localRank = localRank;
  exit.pid = group.pid(localRank);
  return exit;
}

void requestStackDumps(WorkerGroup& group, Attempt& attempt, int nprocPerNode,
                       const std::function<bool(pid_t)>& canDumpStack, std::chrono::steady_clock::time_point deadline) {
  for (int localRank = 0; localRank < nprocPerNode; ++localRank) {
    if (!group.running(localRank)) continue;
    FailureReportInput::RankStack stack{attempt.round.rankOffset + localRank, localRank, {}, {}};
    if (canDumpStack(group.pid(localRank))) {
      group.signalWorker(localRank, SIGABRT);
      attempt.dumping.insert(localRank);
    } else {
      stack.missing = "no Python stack (not a Python process)";
    }
    attempt.stacks.push_back(std::move(stack));
  }
  attempt.dumpDeadline = deadline;
}

bool stackDumpsPending(const WorkerGroup& group, const Attempt& attempt, std::chrono::steady_clock::time_point now) {
  if (now >= attempt.dumpDeadline) return false;
  for (int localRank : attempt.dumping) {
    if (group.running(localRank)) return true;
  }
  return false;
}

void collectStackDumps(WorkerGroup& group, Attempt& attempt, std::chrono::milliseconds waited) {
  for (auto& stack : attempt.stacks) {
    if (!attempt.dumping.count(stack.localRank)) continue;
    group.drainOutput(stack.localRank);
    stack.lines = faulthandlerDump(group.stderrTail(stack.localRank));
    if (stack.lines.empty()) {
      stack.missing = group.running(stack.localRank)
                          ? "no stack within " + formatSeconds(waited) + " (skipped)"
                          : "no stack: the rank ended without a faulthandler dump (PYTHONFAULTHANDLER off?)";
    }
  }
  attempt.dumping.clear();
  attributeFromStacks(attempt);
}

}  // namespace ddprun
