#include "netguard/abuse_guard.h"

#include <catch2/catch.hpp>
#include <chrono>

#include "netguard/http2_frames.h"

using ddprun::AbuseLimits;
using ddprun::AddressPenalties;
using ddprun::CallBudget;
using ddprun::Http2FrameScanner;
using ddprun::TokenBucket;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

TEST_CASE("a token bucket gives its burst at once, then its rate", "[rendezvous][abuse]") {
  const auto t0 = Clock::time_point{} + 1h;
  TokenBucket bucket(10, 5, t0);
  for (int i = 0; i < 5; ++i) CHECK(bucket.take(1, t0));
  CHECK_FALSE(bucket.take(1, t0));
  CHECK(bucket.take(1, t0 + 100ms));  // 10 a second: one more after 100 ms
  CHECK_FALSE(bucket.take(1, t0 + 100ms));
  CHECK(bucket.take(5, t0 + 10s));    // refills to the burst, never beyond it
  CHECK_FALSE(bucket.take(1, t0 + 10s));
  CHECK(TokenBucket(0, 0, t0).take(1e9, t0));  // rate 0: unlimited
}

TEST_CASE("a connection may start its call burst, then is refused for good", "[rendezvous][abuse]") {
  AbuseLimits limits;
  limits.callBurst = 3;
  limits.callsPerSecond = 1;
  const auto t0 = Clock::time_point{} + 1h;
  CallBudget budget(t0, limits);
  for (int i = 0; i < 3; ++i) CHECK(budget.admit(t0, true, limits));
  CHECK_FALSE(budget.admit(t0, true, limits));
  CHECK(budget.refused());
  CHECK(budget.why() == "more than 3 calls at once or 1 a second");
  CHECK_FALSE(budget.admit(t0 + 1h, true, limits));  // final: time does not bring it back
}

TEST_CASE("one call without a valid token is answered, the next one refuses the connection", "[rendezvous][abuse]") {
  AbuseLimits limits;
  const auto t0 = Clock::time_point{} + 1h;
  CallBudget budget(t0, limits);
  CHECK(budget.admit(t0, false, limits));
  CHECK(budget.admit(t0, true, limits));
  CHECK_FALSE(budget.admit(t0, false, limits));
  CHECK(budget.why() == "more than 1 call(s) without a valid job token");
}

TEST_CASE("an offending address is refused for a penalty that doubles on repeats up to the maximum",
          "[rendezvous][abuse]") {
  AbuseLimits limits;
  limits.penalty = 1s;
  limits.maxPenalty = 4s;
  const auto t0 = Clock::time_point{} + 1h;
  AddressPenalties penalties;
  CHECK_FALSE(penalties.refused("192.0.2.1", t0));
  CHECK(penalties.offended("192.0.2.1", t0, limits) == 1s);
  CHECK(penalties.refused("192.0.2.1", t0 + 999ms));
  CHECK_FALSE(penalties.refused("192.0.2.1", t0 + 1s));
  CHECK_FALSE(penalties.refused("192.0.2.2", t0));  // per address
  CHECK(penalties.offended("192.0.2.1", t0 + 2s, limits) == 2s);
  CHECK(penalties.offended("192.0.2.1", t0 + 5s, limits) == 4s);
  CHECK(penalties.offended("192.0.2.1", t0 + 10s, limits) == 4s);  // capped
  // Quiet for longer than the maximum after the penalty ended: back to the first penalty.
  CHECK(penalties.offended("192.0.2.1", t0 + 10s + 4s + 4s + 1ms, limits) == 1s);
  limits.penalty = 0ms;
  CHECK(penalties.offended("192.0.2.3", t0, limits) == 0ms);
  CHECK_FALSE(penalties.refused("192.0.2.3", t0));
}

TEST_CASE("penalties remember a bounded number of addresses", "[rendezvous][abuse]") {
  AbuseLimits limits;
  const auto t0 = Clock::time_point{} + 1h;
  AddressPenalties penalties;
  for (std::size_t i = 0; i < AddressPenalties::kMaxAddresses + 50; ++i) {
    penalties.offended("addr" + std::to_string(i), t0 + std::chrono::milliseconds(i), limits);
  }
  CHECK(penalties.size() == AddressPenalties::kMaxAddresses);
  const std::size_t last = AddressPenalties::kMaxAddresses + 49;
  CHECK(penalties.refused("addr" + std::to_string(last), t0 + std::chrono::milliseconds(last)));
  CHECK_FALSE(penalties.refused("addr0", t0));  // the earliest to end was forgotten first
}

namespace {

std::string frame(unsigned char type, uint32_t stream, std::size_t payload) {
  std::string f;
  f.push_back(static_cast<char>((payload >> 16) & 0xff));
  f.push_back(static_cast<char>((payload >> 8) & 0xff));
  f.push_back(static_cast<char>(payload & 0xff));
  f.push_back(static_cast<char>(type));
  f.push_back(0);
  for (int shift : {24, 16, 8, 0}) f.push_back(static_cast<char>((stream >> shift) & 0xff));
  f.append(payload, 'x');
  return f;
}

}  // namespace

TEST_CASE("the frame scanner counts new streams and control frames, byte by byte or in one piece",
          "[rendezvous][abuse]") {
  std::string bytes = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  bytes += frame(0x4, 0, 6);        // SETTINGS
  bytes += frame(0x1, 1, 40);       // HEADERS: stream 1 opens
  bytes += frame(0x0, 1, 70000);    // DATA, longer than one read
  bytes += frame(0x3, 1, 4);        // RST_STREAM
  bytes += frame(0x1, 3, 10);       // HEADERS: stream 3 opens
  bytes += frame(0x1, 3, 10);       // trailers on stream 3: not a new stream
  bytes += frame(0x6, 0, 8);        // PING
  bytes += frame(0x8, 0, 4);        // WINDOW_UPDATE: neither
  bytes += frame(0x9, 3, 5);        // CONTINUATION
  for (std::size_t piece : {bytes.size(), std::size_t{1}, std::size_t{7}, std::size_t{4096}}) {
    Http2FrameScanner scanner;
    uint64_t streams = 0, control = 0;
    for (std::size_t i = 0; i < bytes.size(); i += piece) {
      auto counts = scanner.feed(bytes.data() + i, std::min(piece, bytes.size() - i));
      streams += counts.newStreams;
      control += counts.controlFrames;
    }
    INFO("pieces of " << piece);
    CHECK(streams == 2);
    CHECK(control == 5);  // SETTINGS, RST_STREAM, trailers, PING, CONTINUATION
  }
}
