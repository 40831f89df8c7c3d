// ddprun --timeline=FILE: this node's events (agent_events.h) as JSON lines, one object per event,
// written as they happen (README "Job timeline"). Each line has "seq" (the job's event number
// the node had heard of: sort the files of every node by it), "n" (this file's own order), "time"
// (this host's wall clock, for people: hosts' clocks differ), "node" and "event".
#pragma once

#include <cstdio>
#include <memory>
#include <string>

#include "agent/agent_events.h"

namespace ddprun {

class TimelineWriter final : public AgentObserver {
 public:
  // Opens (truncates) `path`; throws ConfigError naming it when it cannot.
  explicit TimelineWriter(const std::string& path);
  ~TimelineWriter() override;
  TimelineWriter(const TimelineWriter&) = delete;
  TimelineWriter& operator=(const TimelineWriter&) = delete;

  void onEvent(const AgentEvent& event) override;

  // One line of JSON, without the newline (for tests).
  static std::string format(const AgentEvent& event, uint64_t n);

 private:
  std::FILE* file_ = nullptr;
  uint64_t n_ = 0;
  bool broken_ = false;  // a write failed (disk full): said once, then the timeline stops
};

}  // namespace ddprun
