// Reads what a client sends on an HTTP/2 connection only as far as the frame headers (9 bytes
// each, after the 24-byte preface), to count what costs the server: new streams (each becomes a
// gRPC call) and control frames (PING, SETTINGS, RST_STREAM, PRIORITY, CONTINUATION, GOAWAY).
// Payloads are skipped, never copied or decoded. Used by the connection relay (connection_relay.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/http2_frame_walker.h"

namespace ddprun {

class Http2FrameScanner {
 public:
  struct Counts {
    uint64_t newStreams = 0;     // HEADERS frames that open a stream
    uint64_t controlFrames = 0;  // frames that carry no payload for a call
  };

  // A client's bytes start with the 24-byte preface; a server's (clientSide false) with a frame.
  Http2FrameScanner() = default;
  explicit Http2FrameScanner(bool clientSide) : walker_(clientSide) {}

  // The next bytes the client sent; returns what they completed.
  Counts feed(const char* data, std::size_t size);
  // Whether everything fed so far ends on a frame boundary (a frame may be written next).
  bool atFrameBoundary() const { return walker_.atFrameBoundary(); }
  // The highest stream a HEADERS frame opened so far (0: none).
  uint32_t highestStream() const { return highestStream_; }

 private:
  Http2FrameWalker walker_;
  uint32_t highestStream_ = 0;
};

}  // namespace ddprun
