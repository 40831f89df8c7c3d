// The relay's byte buffers (connection_relay.h): bytes on their way in one direction, appended at
// the back, written from the front, bounded so that a slow reader slows its writer instead of
// growing memory.
#pragma once

#include <cstddef>
#include <vector>

namespace ddprun {

inline constexpr std::size_t kRelayBufferBytes = 256 * 1024;

struct RelayBuffer {
  std::vector<char> bytes;
  std::size_t start = 0;
  std::size_t size() const { return bytes.size() - start; }
  std::size_t room() const { return kRelayBufferBytes - size(); }
  void consumed(std::size_t n) {
    start += n;
    if (start == bytes.size()) {
      bytes.clear();
      bytes.shrink_to_fit();  // most connections are idle most of the time: hold nothing then
      start = 0;
    }
  }
};

// Writes what `out` holds to socket `fd` until it is empty or the socket is full (*progress set
// when a byte went); false when the write failed (the peer is gone).
bool writeBuffered(int fd, RelayBuffer& out, bool* progress);

}  // namespace ddprun
