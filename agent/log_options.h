// Where each worker's output goes: torchrun's --redirects/--tee values, --local_ranks_filter, and
// the line prefix template.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

namespace ddprun {

// Bit set of streams, as torchrun's Std: 0 none, 1 stdout, 2 stderr, 3 both.
enum StdStreams : int { kNoStreams = 0, kStdout = 1, kStderr = 2, kBothStreams = 3 };

// A torchrun stream spec: one value for every local rank ("3") or a per-rank map ("0:3,1:2").
struct StreamSpec {
  int all = kNoStreams;
  std::map<int, int> perRank;

  int forRank(int localRank) const;
  // Throws ConfigError naming the flag on a malformed spec.
  static StreamSpec parse(const std::string& text, const std::string& flagName);
};

struct LogOptions {
  StreamSpec redirects;        // streams that go to files only
  StreamSpec tee;              // streams that go to files and the console
  std::set<int> consoleRanks;  // local ranks shown on the console; empty = all
  std::string prefixTemplate = "[{role}{local_rank}]:";
  std::string logDir;          // per-attempt, per-rank files; empty = none unless redirects ask
  // --duplicate_stdout_filters / --duplicate_stderr_filters (FilteredLog): lines of tee'd ranks
  // holding any of these also go to attempt_<n>/filtered_{stdout,stderr}.log. Empty: none.
  std::vector<std::string> duplicateStdoutFilters;
  std::vector<std::string> duplicateStderrFilters;

  // Throws ConfigError: "0,2" or "0 2".
  static std::set<int> parseRankFilter(const std::string& text);
};

struct PrefixFields {
  int rank = 0;
  int localRank = 0;
  std::string role;
  std::string host;
};

// Expands {rank} {local_rank} {role} {role_name} {host}; torchrun's ${rank} spelling works too.
// Unknown fields are a ConfigError (checked once at start, see validatePrefixTemplate).
std::string expandPrefix(const std::string& tmpl, const PrefixFields& fields);
void validatePrefixTemplate(const std::string& tmpl);

}  // namespace ddprun
