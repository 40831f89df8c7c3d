#include "netguard/http2_frames.h"

namespace ddprun {
namespace {

// Frame types (RFC 9113, section 6).
constexpr unsigned char kHeaders = 0x1, kPriority = 0x2, kRstStream = 0x3, kSettings = 0x4, kPing = 0x6,
                        kGoaway = 0x7, kContinuation = 0x9;

}  // namespace

Http2FrameScanner::Counts Http2FrameScanner::feed(const char* data, std::size_t size) {
  Counts counts;
  walker_.feed(
      data, size,
      [&](const Http2FrameWalker::Frame& f) {
        if (f.type == kHeaders && f.stream > highestStream_) {
          highestStream_ = f.stream;
          ++counts.newStreams;
        } else if (f.type == kHeaders || f.type == kPriority || f.type == kRstStream || f.type == kSettings ||
                   f.type == kPing || f.type == kGoaway || f.type == kContinuation) {
          ++counts.controlFrames;
        }
      },
      [](const char*, std::size_t) {}, [] {}, [] { return true; });
  return counts;
}

}  // namespace ddprun
