#include "agent/timeline.h"

#include <fmt/format.h>

#include <spdlog/spdlog.h>

#include <boost/json.hpp>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "common/error.h"

namespace ddprun {

namespace {

// "2026-11-27T10:15:02.123Z"
std::string utc(std::chrono::system_clock::time_point t) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
  const std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  return fmt::format("{:04d}-{:02d}-{:02d}T{:02d}:{:02d}:{:02d}.{:03d}Z", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                     tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms % 1000));
}

}  // namespace

TimelineWriter::TimelineWriter(const std::string& path) {
  file_ = std::fopen(path.c_str(), "w");
  if (!file_) throw ConfigError("--timeline: cannot write " + path + ": " + std::strerror(errno));
}

TimelineWriter::~TimelineWriter() {
  if (file_) std::fclose(file_);
}

std::string TimelineWriter::format(const AgentEvent& e, uint64_t n) {
  using K = AgentEvent::Kind;
  boost::json::object o{{"seq", e.seq}, {"n", n}, {"time", utc(e.time)}, {"node", e.node}, {"event", agentEventName(e.kind)}};
  if (e.round) o["round"] = e.round;
  switch (e.kind) {
    case K::kRoundFormed: {
      o["group_rank"] = e.groupRank;
      o["group_world_size"] = e.groupWorldSize;
      o["world_size"] = e.worldSize;
      o["restart_count"] = e.restartCount;
      boost::json::array members;
      for (const auto& m : e.members) members.emplace_back(m);
      if (!members.empty()) o["members"] = std::move(members);
      break;
    }
    case K::kWorkerStarted:
    case K::kWorkerSucceeded:
      o["rank"] = e.rank;
      o["local_rank"] = e.localRank;
      o["pid"] = e.pid;
      break;
    case K::kWorkerFailed:
      o["rank"] = e.rank;
      o["local_rank"] = e.localRank;
      o["pid"] = e.pid;
      if (e.signal) {
        o["signal"] = e.signal;
      } else {
        o["exit_code"] = e.exitCode;
      }
      o["exit_status"] = e.exitStatus;
      o["cause"] = e.cause;
      break;
    case K::kHang:
      o["rank"] = e.rank;
      o["local_rank"] = e.localRank;
      break;
    case K::kStraggler:
      o["rank"] = e.rank;
      o["step_us"] = static_cast<int64_t>(std::llround(e.seconds * 1e6));  // an integer: no 1.53E-2
      o["back"] = e.back;
      break;
    case K::kJobEnded: o["exit_status"] = e.exitStatus; break;
    case K::kJoining:
    case K::kRoundInterrupted:
    case K::kFenced: break;
  }
  if (!e.reason.empty()) o["reason"] = e.reason;
  return boost::json::serialize(o);
}

void TimelineWriter::onEvent(const AgentEvent& event) {
  if (broken_) return;
  const std::string line = format(event, ++n_) + "\n";
  // Flushed per line: a reader (tail -f, a test) sees each event as it happens, and a node that
  // is killed leaves every line it wrote.
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0) {
    broken_ = true;
    spdlog::error("--timeline: cannot write: {}; no more events are written", std::strerror(errno));
  }
}

}  // namespace ddprun
