// Logging set-up. ddprun logs through spdlog to stderr, prefixed so that its lines are told apart
// from the workers' lines.
#pragma once

#include <string>

namespace ddprun {

// The prefix of every line ddprun logs, whatever the sink.
inline constexpr const char* kLogPattern = "[ddprun %L %H:%M:%S.%e] %v";

// Accepts spdlog's and Python's level names (debug, info, warning, error, critical, off), case
// insensitive. Throws ConfigError on anything else.
void setupLogging(const std::string& level);

}  // namespace ddprun
