#include "agent/failure_report.h"

#include <csignal>
#include <cstring>
#include <ctime>
#include <sstream>

#include "agent/error_file.h"
#include "agent/stack_dump.h"
#include "agent/worker_group.h"
#include "common/strings.h"

namespace ddprun {
namespace {

std::string formatTime(std::chrono::system_clock::time_point t) {
  std::time_t tt = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  ::localtime_r(&tt, &tm);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d_%H:%M:%S", &tm);
  return buf;
}

std::string describeExit(const WorkerExit& e) {
  if (!e.spawnError.empty()) return "127 (could not start: " + e.spawnError + ")";
  if (!e.hangNote.empty()) return "124 (hung: " + e.hangNote + ")";
  if (e.signal != 0) return "-" + std::to_string(e.signal) + " (" + signalName(e.signal) + ")";
  return std::to_string(e.exitCode);
}

void appendIndented(std::ostringstream& out, const std::string& text) {
  for (const auto& line : split(text, '\n')) {
    if (!line.empty()) out << "      " << line << "\n";
  }
}

}  // namespace

std::string signalName(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

int exitStatusOf(const WorkerExit& exit) {
  if (!exit.hangNote.empty()) return 124;  // as timeout(1)
  if (exit.signal != 0) return 128 + exit.signal;
  return exit.exitCode == 0 ? 1 : exit.exitCode;
}

std::string formatFailureReport(const FailureReportInput& in) {
  const std::string rule(64, '=');
  std::ostringstream out;
  out << rule << "\n" << in.program << " FAILED\n" << std::string(64, '-') << "\n";
  out << "Root cause (first observed failure):\n";
  out << "  time      : " << formatTime(in.first.time) << "\n";
  out << "  host      : " << in.host << "\n";
  out << "  rank      : " << in.first.rank << " (local_rank: " << in.first.localRank << ")\n";
  if (in.first.pid > 0) out << "  pid       : " << in.first.pid << "\n";
  out << "  exitcode  : " << describeExit(in.first) << "\n";
  if (in.error) {
    out << "  error_file: " << in.errorFile << "\n";
    out << "  message   : " << in.error->message << "\n";
    if (!in.error->traceback.empty()) {
      out << "  traceback :\n";
      appendIndented(out, in.error->traceback);
    }
  }
  if (!in.stderrTail.empty()) {
    out << "  stderr (last " << in.stderrTail.size() << " lines):\n";
    for (const auto& line : in.stderrTail) out << "      " << line << "\n";
  }
  if (!in.diagnosis.empty() && !(in.error && in.error->message.find(in.diagnosis) != std::string::npos)) {
    out << "  diagnosis :\n";
    appendIndented(out, in.diagnosis);
  }
  for (const auto& stack : in.stacks) {
    if (stack.inErrorFile) continue;
    out << "Stack of rank " << stack.rank << " (local_rank: " << stack.localRank << ")";
    if (stack.lines.empty()) {
      out << ": " << stack.missing << "\n";
      continue;
    }
    out << ":\n";
    for (const auto& line : stack.lines) out << "      " << line << "\n";
  }
  if (!in.others.empty()) {
    out << "Other failures:\n";
    for (const auto& e : in.others) {
      out << "  rank " << e.rank << " (local_rank: " << e.localRank << "): exitcode " << describeExit(e) << "\n";
    }
  }
  out << rule << "\n";
  return out.str();
}

FailureReportInput gatherFailureReport(const WorkerGroup& group, const WorkerExit& first, const std::string& program,
                                       const std::string& host, const std::string& diagnosis,
                                       const std::vector<FailureReportInput::RankStack>& stacks) {
  FailureReportInput in;
  in.program = program;
  in.host = host;
  in.first = first;
  in.errorFile = group.spec(first.localRank).errorFile;
  in.error = readErrorFile(in.errorFile);
  auto tail = beforeFaulthandlerDump(group.stderrTail(first.localRank));
  constexpr std::size_t kTailShown = 20;
  if (tail.size() > kTailShown) tail.erase(tail.begin(), tail.end() - kTailShown);
  in.stderrTail = std::move(tail);
  in.diagnosis = diagnosis;
  in.stacks = stacks;
  if (!first.hangNote.empty() && !in.error) {
    // The hung rank was killed before it could say anything: its error file gets the diagnosis
    // and its stack, where torchrun's tools look.
    std::string traceback;
    for (const auto& stack : in.stacks) {
      if (stack.localRank != first.localRank) continue;
      for (const auto& line : stack.lines) traceback += line + "\n";
      if (stack.lines.empty()) traceback = stack.missing;
    }
    std::string message = "hung: " + first.hangNote;
    if (!diagnosis.empty()) message += ". " + diagnosis;
    if (writeErrorFile(in.errorFile, message, traceback)) {
      in.error = readErrorFile(in.errorFile);
      for (auto& stack : in.stacks) stack.inErrorFile = stack.inErrorFile || stack.localRank == first.localRank;
    }
  }
  for (const auto& e : group.exits()) {
    bool causedByStop = e.signal == SIGTERM || e.signal == SIGKILL;
    if (e.localRank != first.localRank && !e.succeeded() && !causedByStop) in.others.push_back(e);
  }
  return in;
}

}  // namespace ddprun
