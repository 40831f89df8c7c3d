// The store's own framing ("store wire"): the workers' store operations over a plain TCP
// connection to the rendezvous server's port, without HTTP/2. It carries the same messages as the
// gRPC Session stream (StoreRequest, StoreResponse of store.proto), so the server runs them with
// the same code (StoreRequestHandler, store/core/); what it saves is gRPC's per-message cost and, behind the
// connection guard, the relay's hop (bench/RESULTS_MULTINODE.md, "The store's own framing").
//
//   client: kMagic, then a frame holding a StoreHello (the job token), then StoreRequest frames
//   server: kMagic, then a frame holding a StoreResponse with id 0 (OK, or UNAUTHENTICATED and
//           the connection closes), then StoreResponse frames, in any order (ids pair them)
//   frame:  a 4-byte big-endian length, then that many bytes of one protobuf message
//
// The server's front door (netguard/connection_listener.h) tells the magic from the HTTP/2
// preface and hands the connection to StoreWireServer. A server that does not know the magic
// closes the connection without sending it back, and the client falls back to the Session stream.
// Not over TLS: a client with TLS options uses the Session stream (README "Security").
#pragma once

#include <google/protobuf/message_lite.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "store/core/store_limits.h"

namespace ddprun::storewire {

inline constexpr std::string_view kMagic{"DDPSTORE", 8};
// The largest frame either side takes: the store's message limit (a 64 MiB value with its key and
// framing), as on the gRPC transport.
inline constexpr std::size_t kMaxFrameBytes = kMaxStoreMessageBytes;
// The largest hello either side reads before the other has shown the token: a token file's 4 KiB
// (common/token_file.h) and the client's name, with room to spare. Small, because a server holds
// it for every connection that has not finished its hello (docs/store.md, "Memory").
inline constexpr std::size_t kMaxHelloBytes = 8 * 1024;
inline constexpr std::size_t kHeaderBytes = 4;

// Appends `message` to `out` as one frame.
void appendFrame(std::string& out, const google::protobuf::MessageLite& message);

// Frames out of a byte stream, as it arrives.
class FrameReader {
 public:
  enum class Next { kNeedMore, kFrame, kTooLarge };

  explicit FrameReader(std::size_t maxFrameBytes) : max_(maxFrameBytes) {}
  void setMaxFrameBytes(std::size_t max) { max_ = max; }

  // Where the next bytes go: at least `want` bytes of room, at the end of what is buffered; tell
  // appended(n) how many were written there.
  char* room(std::size_t want);
  void appended(std::size_t n) { end_ += n; }
  // Copies `n` bytes in: for a reader that receives into a buffer of its own and keeps here only
  // what no whole frame took yet (a server with many connections: see compact()).
  void append(const char* data, std::size_t n);
  // Gives back the memory of what was taken, all of it when nothing is left: afterwards the
  // reader holds exactly buffered() bytes. Invalidates the payloads next() returned.
  void compact();
  // Bytes of memory the reader holds now (written, taken or not).
  std::size_t held() const { return buf_.size(); }
  // The size of the frame at the front, header included, once its header is here; 0 before.
  std::size_t pendingFrameBytes() const;
  // Bytes buffered and not yet taken by next() or take().
  std::size_t buffered() const { return end_ - begin_; }
  // What is buffered, not taken (valid until the next call of room()).
  std::string_view peek() const { return std::string_view(buf_.data() + begin_, end_ - begin_); }
  // Takes up to n raw bytes from the front (the magic); returns them.
  std::string_view take(std::size_t n);

  // The next whole frame's payload (valid until the next call of room()), or why there is none:
  // kNeedMore, or kTooLarge when the length says more than the limit (the stream is broken).
  Next next(std::string_view& payload);

 private:
  void toFront();  // moves what is not taken to the front of buf_

  std::size_t max_;
  std::string buf_;
  std::size_t begin_ = 0;  // the first byte not yet taken
  std::size_t end_ = 0;    // one past the last byte written
};

}  // namespace ddprun::storewire
