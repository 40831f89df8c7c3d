// The heartbeat datagram, written once (docs/heartbeat.md): "RANK STEP[ section=NAME][ time=S]\n".
// libddp's Heartbeat writes it, the agent's heartbeat source parses it, and the Python package
// (python/ddprun) writes the same bytes; all three are tested against one table of golden
// datagrams (tests/data/heartbeat_golden.tsv). Here, in common/, so that the worker side and the
// agent side share it without either including the other.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ddprun {

// A section name has at most this many bytes of [A-Za-z0-9._:-].
inline constexpr std::size_t kMaxHeartbeatSection = 64;
// A step's time is finite, non-negative and at most a day; another value is not sent (writers)
// or not taken (the agent), and the beat itself still counts.
inline constexpr double kMaxHeartbeatStepSeconds = 86400.0;
// A datagram longer than this is rejected whole (the writers' longest is about 120 bytes).
inline constexpr std::size_t kMaxHeartbeatDatagram = 255;

struct HeartbeatMessage {
  int rank = 0;
  int64_t step = 0;
  std::string section;                // empty: none
  std::optional<double> stepSeconds;  // the rank's own work in the step ("time=")
  // "recoverable=1": the rank runs under ddprun.recovery and re-enters its training function on a
  // notice instead of being restarted (--recovery=in_process).
  bool recoverable = false;
  // "failed=1": such a rank raised an exception of its own; the agent ends it and recovers it.
  bool failed = false;
};

// The agent's reading of one datagram; nullopt when it is not a heartbeat (ignored, as garbage
// from a confused client is). Unknown key=value tokens are skipped, so that writers may add some.
std::optional<HeartbeatMessage> parseHeartbeat(std::string_view datagram);

// The writers' rules for what callers pass: a section name made one token of the allowed bytes
// (others become '_', cut at kMaxHeartbeatSection, "" becomes "_"); a step time kept only when
// finite and within [0, kMaxHeartbeatStepSeconds].
std::string cleanHeartbeatSection(std::string_view name);
std::optional<double> cleanHeartbeatStepSeconds(double seconds) noexcept;

// Writes the canonical datagram (a clean section, or empty for none; a clean time) into `out`
// without allocating (libddp formats in a noexcept path); returns its length, 0 if it did not fit.
std::size_t formatHeartbeat(int rank, int64_t step, std::string_view section, std::optional<double> stepSeconds,
                            char* out, std::size_t size) noexcept;
std::string formatHeartbeat(const HeartbeatMessage& message);

}  // namespace ddprun
