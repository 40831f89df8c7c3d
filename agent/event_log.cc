#include "agent/event_log.h"

#include <boost/json.hpp>

#include "agent/error_file.h"
#include "agent/worker_group.h"

namespace ddprun {

std::string formatStatusEvent(const StatusEvent& e) {
  namespace json = boost::json;
  // torch keeps its per-worker details in a nested JSON string, with each value in a 1-tuple (an
  // accident of its code, json.dumps of (x,)); kept as is so that its readers parse ours.
  json::object md;
  md["group_world_size"] = e.groupWorldSize;
  md["entry_point"] = e.entryPoint;
  if (e.fromWorker) {
    auto one = [](json::value v) { return json::array{std::move(v)}; };
    md["local_rank"] = one(e.localRank);
    md["role_rank"] = one(e.globalRank);
    md["role_world_size"] = one(e.roleWorldSize);
    md["exit_code"] = e.exitCode ? one(*e.exitCode) : one(nullptr);
    md["worker_pid"] = one(e.pid);
  }
  json::object meta;
  meta["run_id"] = e.runId;
  meta["global_rank"] = e.fromWorker ? json::value(e.globalRank) : json::value(nullptr);
  meta["group_rank"] = e.groupRank;
  meta["worker_id"] = e.fromWorker ? json::value(std::to_string(e.pid)) : json::value(nullptr);
  meta["role"] = e.role;
  meta["hostname"] = e.hostname;
  meta["state"] = e.state;
  meta["total_run_time"] = static_cast<long long>(e.totalRunTimeS);
  meta["rdzv_backend"] = e.rdzvBackend;
  meta["raw_error"] = e.rawError ? json::value(*e.rawError) : json::value(nullptr);
  meta["metadata"] = json::serialize(md);
  meta["agent_restarts"] = e.agentRestarts;
  meta["duration_ms"] = nullptr;
  json::object event;
  event["name"] = "torchelastic.worker.status." + e.state;
  event["source"] = e.fromWorker ? "WORKER" : "AGENT";
  event["timestamp"] = e.timestampMs;
  event["metadata"] = std::move(meta);
  return json::serialize(event);
}

std::string formatRunEndEvents(const StatusEvent& base, const WorkerGroup* group, int nprocPerNode, int worldSize,
                               int exitStatus) {
  std::string lines;
  if (group) {
    for (int localRank = 0; localRank < nprocPerNode; ++localRank) {
      StatusEvent e = base;
      const WorkerSpec& spec = group->spec(localRank);
      e.localRank = localRank;
      e.globalRank = spec.rank;
      e.roleWorldSize = worldSize;
      e.state = "UNKNOWN";
      for (const auto& exit : group->exits()) {
        if (exit.localRank != localRank) continue;
        e.pid = exit.pid;
        e.exitCode = exit.signal ? -exit.signal : exit.exitCode;  // torch's negative signal numbers
        e.state = exit.succeeded() ? "SUCCEEDED" : "FAILED";
        if (!exit.succeeded()) {
          if (auto error = readErrorFile(spec.errorFile)) e.rawError = error->message;
        }
      }
      lines += formatStatusEvent(e) + "\n";
    }
  }
  StatusEvent agent = base;
  agent.fromWorker = false;
  agent.state = exitStatus == 0 ? "SUCCEEDED" : "FAILED";
  lines += formatStatusEvent(agent) + "\n";
  return lines;
}

}  // namespace ddprun
