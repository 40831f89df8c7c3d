#include "agent/failure_report.h"

#include <cstring>
#include <ctime>
#include <sstream>

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

}  // namespace ddprun
