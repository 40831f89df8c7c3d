#include "common/http2_refusal.h"

#include <algorithm>
#include <cstdint>

#include "common/http2_frame_walker.h"
#include "common/strings.h"

namespace ddprun {
namespace {

constexpr unsigned char kSettings = 0x4, kGoaway = 0x7;
constexpr uint32_t kEnhanceYourCalm = 0xb;
constexpr std::size_t kMaxReasonBytes = 256;

void frameHeader(std::string& out, std::size_t length, unsigned char type) {
  out += static_cast<char>((length >> 16) & 0xff);
  out += static_cast<char>((length >> 8) & 0xff);
  out += static_cast<char>(length & 0xff);
  out += static_cast<char>(type);
  out += '\0';                  // flags
  out.append(4, '\0');          // stream 0
}

void u32(std::string& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out += static_cast<char>((v >> shift) & 0xff);
}

}  // namespace

std::string http2ClientPreface() {
  std::string out = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  frameHeader(out, 0, kSettings);
  return out;
}

std::string http2GoAway(std::string_view reason, uint32_t lastStream) {
  reason = reason.substr(0, kMaxReasonBytes);
  std::string out;
  frameHeader(out, 8 + reason.size(), kGoaway);
  u32(out, lastStream & 0x7fffffffu);  // the reserved bit stays clear
  u32(out, kEnhanceYourCalm);
  out.append(reason);
  return out;
}

std::optional<std::string> goAwayReason(std::string_view received) {
  Http2FrameWalker walker(/*clientSide=*/false);
  Http2FrameWalker::Frame frame;
  std::string payload;
  std::optional<std::string> reason;
  walker.feed(
      received.data(), received.size(), [&](const Http2FrameWalker::Frame& f) { frame = f; },
      [&](const char* data, std::size_t n) {
        // Only a GOAWAY's payload is kept, and only as much as a reason may hold.
        constexpr std::size_t kKept = 8 + kMaxReasonBytes;
        if (frame.type == kGoaway && payload.size() < kKept) payload.append(data, std::min(n, kKept - payload.size()));
      },
      [&] {
        if (frame.type == kGoaway && frame.length >= 8) reason = printable(std::string_view(payload).substr(8), kMaxReasonBytes);
        payload.clear();
      },
      [&] { return !reason.has_value(); });
  return reason;  // none, or the stream was cut short before the GOAWAY's end
}

}  // namespace ddprun
