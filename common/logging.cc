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
  // _mt: the agent's gRPC threads, the store's timer and the SDK's threads all log.
  auto logger = std::make_shared<spdlog::logger>("ddprun", std::make_shared<spdlog::sinks::stderr_sink_mt>());
  logger->set_pattern(kLogPattern);
  logger->set_level(parsed);
  logger->flush_on(spdlog::level::trace);
  spdlog::set_default_logger(logger);
}

}  // namespace ddprun
