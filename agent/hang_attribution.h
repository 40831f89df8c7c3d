// The flight recorders of a node's ranks (common/flight_record.h), read while the ranks hang, and
// merged into one line that names the rank that is behind: "rank 2 never started all_reduce #1025;
// ranks 0, 1, 3 wait in it". As nvidia-resiliency-ext's attribution does for torch: ranks issue the
// same collectives in the same order, so the collective numbers line up across ranks.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddprun {

struct CollectiveRecord {
  uint64_t seq = 0;
  std::string op;
  uint64_t bytes = 0;
  bool completed = false;
  bool failed = false;
};

struct RankCollectives {
  int rank = 0;
  std::vector<CollectiveRecord> records;  // oldest first; empty: it issued none
};

// Reads a flight recorder file; nullopt when it is absent or not one (a worker without libddp).
// Bounded: the file has a fixed size, and slots being rewritten are skipped.
std::optional<std::vector<CollectiveRecord>> readFlightRecorder(const std::string& path);

struct HangAttribution {
  std::string line;         // empty when no rank recorded anything
  std::vector<int> behind;  // the ranks that never started the furthest collective
};
HangAttribution attributeHang(const std::vector<RankCollectives>& ranks);

// "rank 2: #1023 all_reduce 4.0 MB completed, #1024 all_reduce 4.0 MB started": the last `n`.
std::string describeRecent(const RankCollectives& rank, std::size_t n = 4);

// Python ranks (no flight recorder): their stacks, dumped by faulthandler while they hang. A rank
// whose stack is inside a torch.distributed call (or DDP's) waits for the others; when exactly one
// rank's stack is outside any while others wait, that rank is the one behind ("rank 1 is outside
// every torch.distributed call while rank 0 waits in one"). On NCCL a rank that waits does so in
// the stream's synchronisation, in its own code (`.item()`), where nothing can be told: then
// `line` is empty, as when the stacks agree.
struct RankStackLines {
  int rank = 0;
  std::vector<std::string> lines;  // the dump; empty: none was taken
};
HangAttribution attributeFromStacks(const std::vector<RankStackLines>& stacks);

}  // namespace ddprun
