// ddprun's own log lines through a ConsoleWriter, so that a blocked stderr cannot stall the agent
// on a warning any more than on a worker's line.
#pragma once

#include <memory>

#include <spdlog/logger.h>

#include "agent/console_writer.h"

namespace ddprun {

// While alive, the default logger writes to `console` (same pattern and level as before); the
// previous logger comes back when it ends.
class ConsoleLogRoute {
 public:
  explicit ConsoleLogRoute(std::shared_ptr<ConsoleWriter> console);
  ~ConsoleLogRoute();
  ConsoleLogRoute(const ConsoleLogRoute&) = delete;
  ConsoleLogRoute& operator=(const ConsoleLogRoute&) = delete;

 private:
  std::shared_ptr<spdlog::logger> previous_;
};

}  // namespace ddprun
