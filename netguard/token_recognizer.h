// Finds the job token in a client's HTTP/2 request headers before gRPC reads them, so that the
// front door can tell an agent that holds the token from a stranger at its first stream: the
// agent's calls skip the budget that all unauthenticated connections share (connection_relay.h),
// and a mass start of thousands of agents, or one beside a flood from the same address, is not
// throttled or cut with the strangers. It follows the client's header blocks (HEADERS and
// CONTINUATION frames) and decodes them with nghttp2's HPACK inflater (libnghttp2, Debian's),
// keeping the connection's dynamic table in step, until it finds the token, or gives up: a
// malformed or oversized block, or kMaxBlocks blocks without it. Giving up only means the
// connection is treated as before, as unauthenticated until gRPC sees a call with the token.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "netguard/http2_frames.h"

namespace ddprun {

class TokenRecognizer {
 public:
  enum class Verdict { kUndecided, kFound, kGaveUp };

  static constexpr std::size_t kMaxBlockBytes = 16 * 1024;  // one request's headers: a few hundred bytes
  static constexpr int kMaxBlocks = 8;                       // an agent's first stream carries the token

  // `metadataKey`: the header that carries the token ("x-ddprun-token"); `token` not empty.
  TokenRecognizer(std::string metadataKey, std::string token);
  ~TokenRecognizer();
  TokenRecognizer(const TokenRecognizer&) = delete;
  TokenRecognizer& operator=(const TokenRecognizer&) = delete;

  // The client's next bytes, from the connection's first byte (the 24-byte preface). Once the
  // verdict is decided, more bytes change nothing.
  Verdict feed(const char* data, std::size_t size);
  Verdict verdict() const { return verdict_; }
  // Header blocks decoded without finding the token.
  int blocksDecoded() const { return blocks_; }

 private:
  void frameDone();
  void decodeBlock();

  std::string key_;
  std::string token_;
  Verdict verdict_ = Verdict::kUndecided;
  Http2FrameWalker walker_;
  unsigned char type_ = 0;       // the current frame's type and flags
  unsigned char flags_ = 0;
  bool collecting_ = false;      // this frame's payload belongs to a header block
  bool inBlock_ = false;         // a HEADERS frame without END_HEADERS: CONTINUATION frames follow
  std::vector<unsigned char> frame_;  // the current HEADERS or CONTINUATION payload
  std::vector<unsigned char> block_;  // the header block so far
  int blocks_ = 0;
  struct Inflater;
  std::unique_ptr<Inflater> inflater_;
};

}  // namespace ddprun
