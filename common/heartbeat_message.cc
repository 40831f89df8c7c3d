#include "common/heartbeat_message.h"

#include <cmath>
#include <cstdint>
#include <cstdio>

#include "common/strings.h"

namespace ddprun {

namespace {

bool sectionByte(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
         c == ':' || c == '-';
}

}  // namespace

std::optional<HeartbeatMessage> parseHeartbeat(std::string_view datagram) {
  if (datagram.size() > kMaxHeartbeatDatagram) return std::nullopt;
  const auto parts = split(trim(datagram), ' ');
  if (parts.size() < 2) return std::nullopt;
  const auto rank = parseInt(parts[0]);
  const auto step = parseInt(parts[1]);
  if (!rank || !step || *rank < 0 || *rank > INT32_MAX) return std::nullopt;
  HeartbeatMessage message;
  message.rank = static_cast<int>(*rank);
  message.step = *step;
  for (std::size_t i = 2; i < parts.size(); ++i) {
    const std::string_view part = parts[i];
    if (startsWith(part, "section=")) {
      // Cleaned as the writers clean it: a confused sender cannot put more than one token in a log line.
      const std::string_view value = part.substr(8);
      message.section = value.empty() ? std::string() : cleanHeartbeatSection(value);
    } else if (part == "recoverable=1") {
      message.recoverable = true;
    } else if (part == "failed=1") {
      message.failed = true;
    } else if (startsWith(part, "time=")) {
      const auto seconds = parseSeconds(part.substr(5));
      message.stepSeconds = seconds ? cleanHeartbeatStepSeconds(*seconds) : std::nullopt;
    }
  }
  return message;
}

std::string cleanHeartbeatSection(std::string_view name) {
  // One '_' per character, not per byte: a UTF-8 character's continuation bytes (10xxxxxx) go
  // with its first, as Python's re.sub on str counts them.
  std::string clean;
  for (std::size_t i = 0; i < name.size() && clean.size() < kMaxHeartbeatSection; ++i) {
    const char c = name[i];
    if (sectionByte(c)) {
      clean += c;
      continue;
    }
    clean += '_';
    if (static_cast<unsigned char>(c) >= 0xC0) {
      while (i + 1 < name.size() && (static_cast<unsigned char>(name[i + 1]) & 0xC0) == 0x80) ++i;
    }
  }
  return clean.empty() ? "_" : clean;
}

std::optional<double> cleanHeartbeatStepSeconds(double seconds) noexcept {
  if (!std::isfinite(seconds) || seconds < 0 || seconds > kMaxHeartbeatStepSeconds) return std::nullopt;
  return seconds;
}

std::size_t formatHeartbeat(int rank, int64_t step, std::string_view section, std::optional<double> stepSeconds,
                            char* out, std::size_t size) noexcept {
  std::size_t n = 0;
  auto append = [&](int written) {
    if (written < 0 || n + static_cast<std::size_t>(written) >= size) return false;
    n += static_cast<std::size_t>(written);
    return true;
  };
  if (!append(std::snprintf(out, size, "%d %lld", rank, static_cast<long long>(step)))) return 0;
  if (!section.empty() && !append(std::snprintf(out + n, size - n, " section=%.*s", static_cast<int>(section.size()),
                                                section.data()))) {
    return 0;
  }
  if (stepSeconds && !append(std::snprintf(out + n, size - n, " time=%.6f", *stepSeconds))) return 0;
  if (!append(std::snprintf(out + n, size - n, "\n"))) return 0;
  return n;
}

std::string formatHeartbeat(const HeartbeatMessage& message) {
  char text[kMaxHeartbeatDatagram + 1];
  const std::size_t n = formatHeartbeat(message.rank, message.step, message.section, message.stepSeconds, text,
                                        sizeof(text));
  return std::string(text, n);
}

}  // namespace ddprun
