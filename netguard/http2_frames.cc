#include "netguard/http2_frames.h"

#include <algorithm>

namespace ddprun {
namespace {

// Frame types (RFC 9113, section 6).
constexpr unsigned char kHeaders = 0x1, kPriority = 0x2, kRstStream = 0x3, kSettings = 0x4, kPing = 0x6,
                        kGoaway = 0x7, kContinuation = 0x9;

}  // namespace

Http2FrameScanner::Counts Http2FrameScanner::feed(const char* data, std::size_t size) {
  Counts counts;
  std::size_t i = 0;
  while (i < size) {
    if (prefaceLeft_ > 0) {
      const std::size_t n = std::min(prefaceLeft_, size - i);
      prefaceLeft_ -= n;
      i += n;
      continue;
    }
    if (payloadLeft_ > 0) {
      const std::size_t n = static_cast<std::size_t>(std::min<uint64_t>(payloadLeft_, size - i));
      payloadLeft_ -= n;
      i += n;
      continue;
    }
    header_[headerHave_++] = static_cast<unsigned char>(data[i++]);
    if (headerHave_ < sizeof(header_)) continue;
    headerHave_ = 0;
    payloadLeft_ = (uint64_t{header_[0]} << 16) | (uint64_t{header_[1]} << 8) | header_[2];
    const unsigned char type = header_[3];
    const uint32_t stream = ((uint32_t{header_[5]} & 0x7f) << 24) | (uint32_t{header_[6]} << 16) |
                            (uint32_t{header_[7]} << 8) | header_[8];
    if (type == kHeaders && stream > highestStream_) {
      highestStream_ = stream;
      ++counts.newStreams;
    } else if (type == kHeaders || type == kPriority || type == kRstStream || type == kSettings || type == kPing ||
               type == kGoaway || type == kContinuation) {
      ++counts.controlFrames;
    }
  }
  return counts;
}

}  // namespace ddprun
