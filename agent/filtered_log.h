// torchrun's --duplicate_stdout_filters / --duplicate_stderr_filters: console lines (with their
// prefix) of the tee'd ranks that contain any of the filter strings are also written to one file
// per attempt, shared by the ranks (attempt_<n>/filtered_stdout.log, filtered_stderr.log).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/unique_fd.h"

namespace ddprun {

class FilteredLog {
 public:
  // Opens (appends to) `path`. Throws SystemError.
  FilteredLog(const std::string& path, std::vector<std::string> needles);

  // Whether `line` holds any of the needles.
  bool matches(std::string_view line) const;
  // Appends whole lines; called on the event loop only, so the ranks' lines never interleave.
  void write(std::string_view lines);

  // torchrun's list syntax: comma-separated, ",," for a comma in a filter; empty items dropped.
  static std::vector<std::string> parseList(const std::string& text);

 private:
  std::vector<std::string> needles_;
  UniqueFd fd_;
};

}  // namespace ddprun
