// libddp's writer of the flight recorder (common/flight_record.h): every collective a Communicator
// issues is recorded as started, then completed or failed when its Work is waited on. One per
// process, opened from DDPRUN_FLIGHT_RECORDER on first use; without the variable (or when the file
// cannot be mapped) nothing is recorded and nothing fails: it is evidence, not a dependency.
#pragma once

#include <cstdint>
#include <string>

#include "worker_sdk/work.h"

namespace ddp::detail {

class FlightRecorder {
 public:
  // The process's recorder, or null when there is none.
  static FlightRecorder* instance();
  // Maps `path` (created, sized) for `rank`; a recorder that records nothing on any error.
  FlightRecorder(const std::string& path, int rank);
  ~FlightRecorder();
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  bool enabled() const { return file_ != nullptr; }
  // A collective is issued; returns its number (0 when not recorded).
  uint64_t started(const char* op, uint64_t bytes) noexcept;
  void finished(uint64_t seq, bool ok) noexcept;

 private:
  struct Mapped;
  void* file_ = nullptr;  // ddprun::flight::File, shared with the agent
  uint64_t next_ = 0;     // guarded by the atomic increment in started()
};

// `work` wrapped so that its completion marks collective `seq` finished.
Work recordedWork(Work work, uint64_t seq);

// Issues a collective through `start` (a callable returning its Work), recorded: started before
// it is issued (a rank stuck in the issue is inside it), completed or failed when its Work is
// waited on or seen completed.
template <class Start>
Work recorded(const char* op, uint64_t bytes, Start&& start) {
  FlightRecorder* recorder = FlightRecorder::instance();
  if (!recorder) return start();
  const uint64_t seq = recorder->started(op, bytes);
  try {
    return recordedWork(start(), seq);
  } catch (...) {
    recorder->finished(seq, false);
    throw;
  }
}

}  // namespace ddp::detail
