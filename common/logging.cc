#include "common/logging.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/error.h"

namespace ddprun {

void setupLogging(const std::string& level) {
  std::string name = level;
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  if (name == "warning") name = "warn";
  if (name == "fatal") name = "critical";
  auto parsed = spdlog::level::from_str(name);
  if (parsed == spdlog::level::off && name != "off") {
    throw ConfigError("invalid log level '" + level + "' (use debug, info, warning, error, critical or off)");
  }
  // The locking (_mt) sink: gRPC's threads, the rendezvous daemon's and the agent's log at once, and
  // the sink's formatter keeps state between lines (tests/unit/logging_test.cc).
  auto logger = std::make_shared<spdlog::logger>("ddprun", std::make_shared<spdlog::sinks::stderr_sink_mt>());
  logger->set_pattern(kLogPattern);
  logger->set_level(parsed);
  logger->flush_on(spdlog::level::trace);
  spdlog::set_default_logger(logger);
}

}  // namespace ddprun
