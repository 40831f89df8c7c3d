// Reads what a client sends on an HTTP/2 connection only as far as the frame headers (9 bytes
// each, after the 24-byte preface), to count what costs the server: new streams (each becomes a
// gRPC call) and control frames (PING, SETTINGS, RST_STREAM, PRIORITY, CONTINUATION, GOAWAY).
// Payloads are skipped, never copied or decoded. Used by the connection relay (connection_relay.h).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ddprun {

class Http2FrameScanner {
 public:
  struct Counts {
    uint64_t newStreams = 0;     // HEADERS frames that open a stream
    uint64_t controlFrames = 0;  // frames that carry no payload for a call
  };

  // A client's bytes start with the 24-byte preface; a server's (clientSide false) with a frame.
  Http2FrameScanner() = default;
  explicit Http2FrameScanner(bool clientSide) : prefaceLeft_(clientSide ? 24 : 0) {}

  // The next bytes the client sent; returns what they completed.
  Counts feed(const char* data, std::size_t size);
  // Whether everything fed so far ends on a frame boundary (a frame may be written next).
  bool atFrameBoundary() const { return prefaceLeft_ == 0 && headerHave_ == 0 && payloadLeft_ == 0; }

 private:
  std::size_t prefaceLeft_ = 24;
  unsigned char header_[9] = {};
  std::size_t headerHave_ = 0;
  uint64_t payloadLeft_ = 0;
  uint32_t highestStream_ = 0;
};

}  // namespace ddprun
