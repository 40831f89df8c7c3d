#include "agent/failure_report.h"

#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>

#include "agent/json_value.h"
#include "common/strings.h"

namespace ddprun {
namespace {

// A string member as it is, a number as an integer (torchrun writes timestamps either way).
std::string stringField(const json::Value* object, std::string_view name) {
  const json::Value* v = object ? object->member(name) : nullptr;
  if (!v) return {};
  if (const std::string* s = v->asString()) return *s;
  if (const double* n = v->asNumber()) return std::to_string(static_cast<long long>(*n));
  return {};
}

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

std::optional<ErrorFileContent> readErrorFile(const std::string& path) {
  if (path.empty()) return std::nullopt;
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream buf;
  buf << in.rdbuf();
  std::string text = buf.str();
  if (trim(text).empty()) return std::nullopt;

  ErrorFileContent content;
  auto root = json::parse(text);
  if (!root || !root->asObject()) {
    content.message = std::string(trim(text));
    return content;
  }
  const json::Value* message = root->member("message");
  if (message && message->asObject()) {
    content.message = stringField(message, "message");
    const json::Value* extra = message->member("extraInfo");
    content.traceback = stringField(extra, "py_callstack");
    content.timestamp = stringField(extra, "timestamp");
  } else {
    content.message = stringField(&*root, "message");
  }
  if (content.message.empty()) content.message = std::string(trim(text));
  return content;
}

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
