// The flight recorder's file: the last collectives of one worker, written by libddp through a
// shared mapping of DDPRUN_FLIGHT_RECORDER (a file the agent names per rank and attempt) and read
// by the agent when a rank hangs, even though the worker is stuck: nothing is asked of it. The
// agent merges the ranks' records into one line that names the rank that is behind
// (agent/hang_attribution.h). Plain data, the same layout on both sides (one machine, one ABI).
#pragma once

#include <cstdint>

namespace ddprun::flight {

inline constexpr uint64_t kMagic = 0x3152'4654'5044'4444ULL;  // "DDDPTFR1", little-endian
inline constexpr uint32_t kCapacity = 64;                      // the last 64 collectives

enum class State : uint32_t { kStarted = 1, kCompleted = 2, kFailed = 3 };

// One collective. `seq` (the collective's number in the process, from 1) is written last on start
// and read first and last by the agent, so a slot being rewritten is skipped, never misread.
struct Entry {
  uint64_t seq;
  uint64_t bytes;
  int64_t startedNs;  // CLOCK_MONOTONIC
  uint32_t state;     // State
  char op[20];        // "all_reduce", NUL-terminated
};

struct File {
  uint64_t magic;
  uint32_t capacity;
  int32_t rank;
  Entry entries[kCapacity];  // the collective numbered seq is in entries[(seq - 1) % kCapacity]
};

static_assert(sizeof(Entry) == 48, "the file layout is shared by libddp and the agent");

}  // namespace ddprun::flight
