// The bound on error messages that cross the network: every ddprun service and every transport of
// the store cuts its errors to it.
#pragma once

#include <cstddef>
#include <string>

namespace ddprun {

// The longest message an error status carries: far under gRPC's 8 KB metadata limit, which a
// longer one would break (the client would see RESOURCE_EXHAUSTED instead of the error).
inline constexpr std::size_t kMaxErrorMessageBytes = 1024;

// `message` cut to kMaxErrorMessageBytes, saying how much was cut: no error may echo unbounded input.
inline std::string boundedErrorMessage(std::string message) {
  if (message.size() <= kMaxErrorMessageBytes) return message;
  constexpr std::size_t kKept = kMaxErrorMessageBytes - 32;
  const std::size_t cut = message.size() - kKept;
  message.resize(kKept);
  return message + "... (+" + std::to_string(cut) + " bytes)";
}

}  // namespace ddprun
