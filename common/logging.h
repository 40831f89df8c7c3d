// Logging set-up. ddprun logs through spdlog to stderr, prefixed so that its lines are told apart
// from the workers' lines.
#pragma once

#include <string>

namespace ddprun {

// Accepts spdlog's and Python's level names (debug, info, warning, error, critical, off), case
// insensitive. Throws ConfigError on anything else.
void setupLogging(const std::string& level);

}  // namespace ddprun
