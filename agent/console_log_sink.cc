#include "agent/console_log_sink.h"

#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include <mutex>
#include <string_view>

#include "common/logging.h"

namespace ddprun {
namespace {

class ConsoleSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit ConsoleSink(std::shared_ptr<ConsoleWriter> console) : console_(std::move(console)) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t formatted;
    formatter_->format(msg, formatted);
    console_->write(std::string_view(formatted.data(), formatted.size()));
  }
  void flush_() override {}

 private:
  std::shared_ptr<ConsoleWriter> console_;
};

}  // namespace

ConsoleLogRoute::ConsoleLogRoute(std::shared_ptr<ConsoleWriter> console) : previous_(spdlog::default_logger()) {
  auto logger = std::make_shared<spdlog::logger>("ddprun", std::make_shared<ConsoleSink>(std::move(console)));
  logger->set_pattern(kLogPattern);
  logger->set_level(previous_->level());
  spdlog::set_default_logger(logger);
}

ConsoleLogRoute::~ConsoleLogRoute() { spdlog::set_default_logger(previous_); }

}  // namespace ddprun
