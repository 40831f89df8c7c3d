// Walks HTTP/2 framing (RFC 9113) without copying or decoding a payload: the one frame walker of
// ddprun. The daemon's relay counts frames with it (netguard/http2_frames.h), the token recognizer
// reads header blocks with it, and an agent reads a server's GOAWAY with it (http2_refusal.h).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace ddprun {

// The one walk over HTTP/2 framing: the preface, then each frame's 9-byte header and its payload,
// fed in pieces of any size. The frame scanner (netguard/http2_frames.h) counts with it; the token recognizer
// (token_recognizer.h) reads header blocks with it.
class Http2FrameWalker {
 public:
  struct Frame {
    uint32_t length = 0;
    unsigned char type = 0;
    unsigned char flags = 0;
    uint32_t stream = 0;
  };

  // A client's bytes start with the 24-byte preface; a server's (clientSide false) with a frame.
  explicit Http2FrameWalker(bool clientSide = true) : prefaceLeft_(clientSide ? 24 : 0) {}

  // Calls onFrame(const Frame&) at each complete frame header, onPayload(const char*, size_t) for
  // each piece of its payload, and onFrameEnd() once the payload is over (at once for an empty
  // one). Stops at once, returning false, when keepGoing() turns false.
  template <typename OnFrame, typename OnPayload, typename OnFrameEnd, typename KeepGoing>
  bool feed(const char* data, std::size_t size, OnFrame onFrame, OnPayload onPayload, OnFrameEnd onFrameEnd,
            KeepGoing keepGoing) {
    std::size_t i = 0;
    while (i < size) {
      if (!keepGoing()) return false;
      if (prefaceLeft_ > 0) {
        const std::size_t n = std::min(prefaceLeft_, size - i);
        prefaceLeft_ -= n;
        i += n;
        continue;
      }
      if (payloadLeft_ > 0) {
        const std::size_t n = std::min<std::size_t>(payloadLeft_, size - i);
        onPayload(data + i, n);
        payloadLeft_ -= static_cast<uint32_t>(n);
        i += n;
        if (payloadLeft_ == 0) onFrameEnd();
        continue;
      }
      header_[headerHave_++] = static_cast<unsigned char>(data[i++]);
      if (headerHave_ < sizeof(header_)) continue;
      headerHave_ = 0;
      Frame f;
      f.length = (uint32_t{header_[0]} << 16) | (uint32_t{header_[1]} << 8) | header_[2];
      f.type = header_[3];
      f.flags = header_[4];
      f.stream = ((uint32_t{header_[5]} & 0x7f) << 24) | (uint32_t{header_[6]} << 16) | (uint32_t{header_[7]} << 8) |
                 header_[8];
      payloadLeft_ = f.length;
      onFrame(f);
      if (payloadLeft_ == 0) onFrameEnd();
    }
    return keepGoing();
  }

  // Whether everything fed so far ends on a frame boundary (a frame may be written next).
  bool atFrameBoundary() const { return prefaceLeft_ == 0 && headerHave_ == 0 && payloadLeft_ == 0; }

 private:
  std::size_t prefaceLeft_ = 24;
  unsigned char header_[9] = {};
  std::size_t headerHave_ = 0;
  uint32_t payloadLeft_ = 0;
};

}  // namespace ddprun
