// The HTTP/2 refusal a server writes before it closes a connection (common/http2_refusal.h) and
// what a client reads back from it; the relay's view of where a server's frames end.
#include <catch2/catch.hpp>

#include <string>

#include "common/http2_refusal.h"
#include "netguard/http2_frames.h"

using namespace ddprun;

namespace {
// A server's empty SETTINGS frame, as gRPC sends first.
const std::string kSettings("\0\0\0\x04\0\0\0\0\0", 9);
}  // namespace

TEST_CASE("http2 refusal: the reason in the GOAWAY is read back, after other frames", "[http2]") {
  const std::string frames = kSettings + http2GoAway("at its connection limit (128 descriptors)");
  REQUIRE(frames.size() == 9 + 9 + 8 + 41);
  CHECK(frames[3] == 0x4);   // SETTINGS first: the server's preface
  CHECK(frames[12] == 0x7);  // then GOAWAY
  CHECK(goAwayReason(frames) == std::optional<std::string>("at its connection limit (128 descriptors)"));
  CHECK_FALSE(goAwayReason(frames.substr(0, frames.size() - 1)).has_value());  // cut short
  CHECK_FALSE(goAwayReason(frames.substr(0, 9)).has_value());                  // SETTINGS only
  CHECK(goAwayReason(http2GoAway("a\nb")) == std::optional<std::string>("a\\x0ab"));  // printable
  CHECK(goAwayReason(http2GoAway(std::string(1000, 'x')))->size() == 256);
}

TEST_CASE("http2 frames: a server's bytes end on a frame boundary only between frames", "[http2]") {
  Http2FrameScanner server(false);
  CHECK(server.atFrameBoundary());
  const std::string two = kSettings + http2GoAway("why");
  server.feed(two.data(), 5);
  CHECK_FALSE(server.atFrameBoundary());
  server.feed(two.data() + 5, 4);  // the SETTINGS frame, whole
  CHECK(server.atFrameBoundary());
  server.feed(two.data() + 9, two.size() - 10);
  CHECK_FALSE(server.atFrameBoundary());
  server.feed(two.data() + two.size() - 1, 1);
  CHECK(server.atFrameBoundary());
  Http2FrameScanner client;  // a client's bytes start with the 24-byte preface
  CHECK_FALSE(client.atFrameBoundary());
  const std::string preface = http2ClientPreface();
  client.feed(preface.data(), preface.size());
  CHECK(client.atFrameBoundary());
}

TEST_CASE("http2 refusal: a GOAWAY names the last stream the server may have processed", "[http2]") {
  const std::string fresh = ddprun::http2GoAway("why");
  // 9-byte frame header, then the last stream id (4 bytes, big-endian).
  CHECK(fresh.substr(9, 4) == std::string("\0\0\0\0", 4));
  const std::string cut = ddprun::http2GoAway("why", 0x80000007u);
  CHECK(cut.substr(9, 4) == std::string("\0\0\0\x07", 4));  // the reserved bit cleared
  CHECK(ddprun::goAwayReason(cut) == std::optional<std::string>("why"));
}
