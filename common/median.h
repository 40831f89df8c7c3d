// The median of a few values (a rank's window of step times, the ranks of a job): one rule for the
// agent's straggler detector and the rules host's job-wide view.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace ddprun {

// The middle value, or the mean of the two middle ones; 0 for none. Takes a copy: it reorders it.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  const std::size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  if (v.size() % 2) return v[mid];
  const double upper = v[mid];
  return (upper + *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid))) / 2;
}

}  // namespace ddprun
