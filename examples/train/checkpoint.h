// The trainer's checkpoint: the parameters and the number of epochs completed, in a small binary
// file written atomically (temporary file + rename), so a crash never leaves half a checkpoint.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace train {

struct Checkpoint {
  int epochsDone = 0;
  uint64_t seed = 0;  // of the run that wrote it: resuming another run's checkpoint is refused
  std::vector<float> params;
};

// Throws std::runtime_error when the file cannot be written.
void saveCheckpoint(const std::string& path, const Checkpoint& checkpoint);
// nullopt when the file does not exist; std::runtime_error when it exists but is not a checkpoint
// of `paramCount` parameters.
std::optional<Checkpoint> loadCheckpoint(const std::string& path, std::size_t paramCount);

}  // namespace train
