#include "metrics/process_collector.h"

#include <unistd.h>

#include <charconv>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <system_error>
#include <utility>

namespace ddprun {

namespace {

using prometheus::MetricFamily;
using prometheus::MetricType;

std::optional<std::string> readText(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::optional<double> toNumber(std::string_view text) {
  unsigned long long value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return static_cast<double>(value);
}

// The fields of /proc/self/stat from field 3 on (proc(5) numbers them from 1): the command name
// in field 2 may hold spaces and parentheses, so the split starts after its last ')'.
std::vector<std::string> statFields(const std::optional<std::string>& stat) {
  std::vector<std::string> fields;
  const auto close = stat ? stat->rfind(')') : std::string::npos;
  if (close == std::string::npos) return fields;
  std::istringstream in(stat->substr(close + 1));
  for (std::string field; in >> field;) fields.push_back(field);
  return fields;
}

std::optional<double> statField(const std::vector<std::string>& fields, std::size_t procNumber) {
  if (procNumber < 3 || procNumber - 3 >= fields.size()) return std::nullopt;
  return toNumber(fields[procNumber - 3]);
}

// The number after `key` on the line that starts with it ("btime 1700000000" in /proc/stat, the
// soft limit in "Max open files  1024  524288  files" of /proc/self/limits).
std::optional<double> valueAfter(const std::optional<std::string>& text, const std::string& key) {
  if (!text) return std::nullopt;
  std::istringstream lines(*text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(key, 0) != 0) continue;
    std::istringstream rest(line.substr(key.size()));
    std::string value;
    rest >> value;
    return toNumber(value);  // "unlimited": no sample
  }
  return std::nullopt;
}

std::optional<double> openFds(const std::string& dir) {
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec), end;
  if (ec) return std::nullopt;
  double count = 0;
  for (; it != end; it.increment(ec)) {
    if (ec) return std::nullopt;
    ++count;
  }
  return ec ? std::nullopt : std::optional<double>(count);
}

void add(std::vector<MetricFamily>& out, const char* name, const char* help, MetricType type,
         std::optional<double> value) {
  if (!value) return;
  prometheus::ClientMetric sample;
  if (type == MetricType::Counter) sample.counter.value = *value;
  else sample.gauge.value = *value;
  out.push_back(MetricFamily{name, help, type, {sample}});
}

template <typename F>
std::optional<double> combine(std::optional<double> a, std::optional<double> b, F f) {
  if (!a || !b) return std::nullopt;
  return f(*a, *b);
}

}  // namespace

ProcessCollector::ProcessCollector(std::string procRoot) : procRoot_(std::move(procRoot)) {}

std::vector<MetricFamily> ProcessCollector::Collect() const {
  const double ticksPerSecond = static_cast<double>(::sysconf(_SC_CLK_TCK));
  const double pageBytes = static_cast<double>(::sysconf(_SC_PAGESIZE));
  const auto stat = statFields(readText(procRoot_ + "/self/stat"));
  const auto bootTime = valueAfter(readText(procRoot_ + "/stat"), "btime");

  std::vector<MetricFamily> out;
  add(out, "process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", MetricType::Counter,
      combine(statField(stat, 14), statField(stat, 15), [&](double user, double system) {
        return (user + system) / ticksPerSecond;
      }));
  add(out, "process_virtual_memory_bytes", "Virtual memory size in bytes.", MetricType::Gauge, statField(stat, 23));
  add(out, "process_resident_memory_bytes", "Resident memory size in bytes.", MetricType::Gauge,
      combine(statField(stat, 24), std::optional<double>(pageBytes), [](double pages, double size) {
        return pages * size;
      }));
  add(out, "process_start_time_seconds", "Start time of the process since unix epoch in seconds.", MetricType::Gauge,
      combine(bootTime, statField(stat, 22), [&](double boot, double ticks) { return boot + ticks / ticksPerSecond; }));
  add(out, "process_open_fds", "Number of open file descriptors.", MetricType::Gauge, openFds(procRoot_ + "/self/fd"));
  add(out, "process_max_fds", "Maximum number of open file descriptors.", MetricType::Gauge,
      valueAfter(readText(procRoot_ + "/self/limits"), "Max open files"));
  add(out, "ddprun_process_threads", "Number of threads of the process.", MetricType::Gauge, statField(stat, 20));
  return out;
}

}  // namespace ddprun
