// ddprun's logger is shared by threads (the agent's gRPC threads, the store's timer, the SDK): its
// sinks must be the thread-safe kind, and lines logged at once from several threads arrive whole.
// Under ThreadSanitizer (docs/sanitizers.md) the second case also shows that no race remains.
#include "common/logging.h"

#include <spdlog/details/console_globals.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <catch2/catch.hpp>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "common/strings.h"
#include "test_util.h"

namespace {

// Restores whatever logger a test replaced.
struct KeepLogger {
  std::shared_ptr<spdlog::logger> saved = spdlog::default_logger();
  ~KeepLogger() { spdlog::set_default_logger(saved); }
};

}  // namespace

TEST_CASE("logging: every sink of ddprun's logger locks (the _mt kind)", "[logging]") {
  KeepLogger keep;
  ddprun::setupLogging("info");
  const auto& sinks = spdlog::default_logger()->sinks();
  REQUIRE_FALSE(sinks.empty());
  for (const auto& sink : sinks) {
    // spdlog's single-threaded sinks are the same templates over null_mutex.
    CHECK(dynamic_cast<spdlog::sinks::base_sink<spdlog::details::null_mutex>*>(sink.get()) == nullptr);
    CHECK(dynamic_cast<spdlog::sinks::stdout_sink_base<spdlog::details::console_nullmutex>*>(sink.get()) == nullptr);
  }
}

TEST_CASE("logging: lines from many threads at once arrive whole, one per line", "[logging]") {
  KeepLogger keep;
  ddprun::test::OutputCapture err(2);
  ddprun::setupLogging("info");
  constexpr int kThreads = 8;
  constexpr int kLines = 300;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < kLines; ++i) spdlog::info("thread {} line {} {}", t, i, std::string(40, 'a' + t));
    });
  }
  for (auto& th : threads) th.join();
  std::string text = err.text();
  err.restore();
  const std::regex whole(R"(\[ddprun I \d\d:\d\d:\d\d\.\d{3}\] thread (\d) line (\d+) ([a-h])\3{39})");
  int count = 0;
  for (const auto& line : ddprun::split(text, '\n')) {
    if (line.empty()) continue;
    INFO(line);
    CHECK(std::regex_match(line, whole));
    ++count;
  }
  CHECK(count == kThreads * kLines);
}
