// torchrun's --event_log_handler: torchelastic events as JSON lines, in torch's format
// ({"name", "source", "timestamp", "metadata"}; torch.distributed.elastic.events.Event), so tools
// that read torchrun's events read ddprun's. At the end of a run the agent records one
// "torchelastic.worker.status.<STATE>" event per worker (source WORKER) and one for itself
// (source AGENT), as torch's SimpleElasticAgent does.
#pragma once

#include <optional>
#include <string>

namespace ddprun {

struct StatusEvent {
  std::string state;           // SUCCEEDED, FAILED, UNKNOWN
  bool fromWorker = true;      // source WORKER, else AGENT
  long long timestampMs = 0;   // wall clock, milliseconds since the epoch
  std::string runId;
  std::string role;
  std::string hostname;
  std::string rdzvBackend;
  std::string entryPoint;      // the program as typed
  int groupRank = 0;
  int groupWorldSize = 1;
  int agentRestarts = 0;       // restarts spent
  double totalRunTimeS = 0;
  // Workers only.
  int localRank = 0;
  int globalRank = 0;
  int roleWorldSize = 1;
  long pid = 0;
  std::optional<int> exitCode;  // absent: still running or never started
  std::optional<std::string> rawError;
};

// One line of JSON, without the newline.
std::string formatStatusEvent(const StatusEvent& event);

class WorkerGroup;

// The end of a run, as torch's SimpleElasticAgent records it: one line per worker of the last
// group (null: none started) with its exit and error file, then the agent's; `base` holds what
// every line shares.
std::string formatRunEndEvents(const StatusEvent& base, const WorkerGroup* group, int nprocPerNode, int worldSize,
                               int exitStatus);

}  // namespace ddprun
