// The trainer's command line: --epochs N --batch B --lr X --seed S --backend gloo|nccl
// --checkpoint PATH --crash_at_epoch E --timeout S --device D (both "--flag value" and "--flag=value").
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace train {

struct Options {
  int epochs = 5;
  int batch = 64;              // the global batch, split evenly over the ranks
  double lr = 0.4;
  uint64_t seed = 1;
  std::string backend = "gloo";
  std::string checkpoint;      // empty: no checkpoint
  int crashAtEpoch = 0;        // test hook: rank 1 exits with 3 at the start of this epoch (first attempt only)
  // Test hooks for hangs (first attempt only, rank 1, 0 = off): before the reduction of this global
  // step, rank 1 sleeps for 600 s (stuck before a collective), or exits 0 (seed 001: it left,
  // the others wait for it in the all-reduce).
  int stallAtStep = 0;
  int leaveAtStep = 0;
  // Test hook for stragglers: rank slowRank (-1: none) spends slowMs more on every step's work.
  int slowRank = -1;
  int slowMs = 0;
  int samples = 4096;
  double timeoutS = 1800;      // the communicator's timeout (bootstrap and every collective)
  // nccl: the CUDA device (-1: LOCAL_RANK's). Lets the real-GPU checks run two ranks on one GPU,
  // each its own NCCL "host" (NCCL_HOSTID), as NCCL refuses two ranks of one host on one device.
  int device = -1;
  bool help = false;
};

// Parses argv; throws std::invalid_argument with a message naming the bad flag.
Options parseOptions(int argc, char** argv);
const char* usage();

}  // namespace train
