#include "common/logging.h"

#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <ctime>
#include <regex>
#include <set>
#include <thread>
#include <vector>

#include "common/strings.h"
#include "test_util.h"

namespace {

// What the "%H:%M:%S.%e" of the ddprun pattern shows for t (local time, as spdlog formats it).
std::string shownTime(std::chrono::system_clock::time_point t) {
  const std::time_t secs = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  ::localtime_r(&secs, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%H:%M:%S", &tm);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count() % 1000;
  return fmt::format("{}.{:03d}", buf, ms);
}

// Restores the default logger that setupLogging replaces.
class DefaultLoggerGuard {
 public:
  DefaultLoggerGuard() : previous_(spdlog::default_logger()) {}
  ~DefaultLoggerGuard() { spdlog::set_default_logger(previous_); }

 private:
  std::shared_ptr<spdlog::logger> previous_;
};

}  // namespace

TEST_CASE("setupLogging's logger takes lines from many threads at once, each whole with its own time",
          "[logging]") {
  // The agent, the rendezvous daemon and gRPC's threads log at once. Each thread here logs with its
  // own time of day, so that the sink's formatter, which caches the broken-down time of the last
  // line, gives a line another thread's time unless the sink serializes its callers (an _st sink
  // does not; ThreadSanitizer reports the race there too).
  constexpr int kThreads = 8;
  constexpr int kLines = 2000;
  const auto base = std::chrono::time_point_cast<std::chrono::seconds>(std::chrono::system_clock::now());
  std::vector<std::chrono::system_clock::time_point> times;
  std::vector<std::string> payloads;
  for (int t = 0; t < kThreads; ++t) {
    times.push_back(base + std::chrono::seconds(3661 * t) + std::chrono::milliseconds(t));
    payloads.push_back(std::string(120, static_cast<char>('a' + t)));
  }

  std::string captured;
  {
    DefaultLoggerGuard restoreLogger;
    ddprun::test::OutputCapture stderrCapture(2);
    ddprun::setupLogging("info");
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < kLines; ++i) {
          const std::string line = "thread " + std::to_string(t) + " line " + std::to_string(i) + " " + payloads[t];
          spdlog::default_logger_raw()->log(times[t], spdlog::source_loc{}, spdlog::level::info, line);
        }
      });
    }
    for (auto& thread : threads) thread.join();
    captured = stderrCapture.text();
  }

  const std::regex linePattern(R"(\[ddprun I (\S+)\] thread (\d+) line (\d+) ([a-z]+))");
  std::set<std::pair<int, int>> seen;
  int wrong = 0;
  for (const auto& line : ddprun::split(captured, '\n')) {
    if (line.empty()) continue;
    std::smatch m;
    const bool whole = std::regex_match(line, m, linePattern);
    const int t = whole ? std::stoi(m[2]) : -1;
    const bool right = whole && t >= 0 && t < kThreads && m[1] == shownTime(times[t]) && m[4] == payloads[t] &&
                       seen.emplace(t, std::stoi(m[3])).second;
    if (!right && ++wrong <= 5) UNSCOPED_INFO("wrong line: " << line);
  }
  CHECK(wrong == 0);
  CHECK(seen.size() == static_cast<std::size_t>(kThreads * kLines));
}
