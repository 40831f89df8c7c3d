#include "common/http2_refusal.h"

#include <cstdint>

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

std::string http2GoAway(std::string_view reason) {
  reason = reason.substr(0, kMaxReasonBytes);
  std::string out;
  frameHeader(out, 8 + reason.size(), kGoaway);
  u32(out, 0);  // last stream id: nothing was processed
  u32(out, kEnhanceYourCalm);
  out.append(reason);
  return out;
}

std::optional<std::string> goAwayReason(std::string_view received) {
  std::size_t i = 0;
  while (received.size() - i >= 9) {
    const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(received[i + k]); };
    const std::size_t length = (std::size_t{byte(0)} << 16) | (std::size_t{byte(1)} << 8) | byte(2);
    const unsigned char type = byte(3);
    if (received.size() - i - 9 < length) return std::nullopt;  // cut short
    if (type == kGoaway && length >= 8) return printable(received.substr(i + 9 + 8, length - 8), kMaxReasonBytes);
    i += 9 + length;
  }
  return std::nullopt;
}

}  // namespace ddprun
