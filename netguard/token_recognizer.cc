#include "netguard/token_recognizer.h"

#include <nghttp2/nghttp2.h>

#include <algorithm>

#include "common/secrets.h"
#include "common/strings.h"

namespace ddprun {
namespace {

constexpr unsigned char kHeaders = 0x1, kContinuation = 0x9;
constexpr unsigned char kEndHeaders = 0x4, kPadded = 0x8, kPriorityFlag = 0x20;
// The largest dynamic table a client may use here: gRPC's server advertises 4096, and a client
// that still says more gets a decoding error, which only means giving up.
constexpr std::size_t kTableBytes = 65536;

}  // namespace

struct TokenRecognizer::Inflater {
  nghttp2_hd_inflater* hd = nullptr;
  ~Inflater() {
    if (hd) nghttp2_hd_inflate_del(hd);
  }
};

TokenRecognizer::TokenRecognizer(std::string metadataKey, std::string token)
    : key_(std::move(metadataKey)), token_(std::move(token)), inflater_(std::make_unique<Inflater>()) {
  if (token_.empty() || nghttp2_hd_inflate_new(&inflater_->hd) != 0 ||
      nghttp2_hd_inflate_change_table_size(inflater_->hd, kTableBytes) != 0) {
    verdict_ = Verdict::kGaveUp;
  }
}

TokenRecognizer::~TokenRecognizer() = default;

TokenRecognizer::Verdict TokenRecognizer::feed(const char* data, std::size_t size) {
  walker_.feed(
      data, size,
      [&](const Http2FrameWalker::Frame& f) {
        frame_.clear();
        type_ = f.type;
        flags_ = f.flags;
        collecting_ = f.type == kHeaders || (f.type == kContinuation && inBlock_);
        if (collecting_ && f.length > kMaxBlockBytes) verdict_ = Verdict::kGaveUp;
      },
      [&](const char* piece, std::size_t n) {
        if (collecting_) frame_.insert(frame_.end(), piece, piece + n);
      },
      [&] {
        if (verdict_ == Verdict::kUndecided) frameDone();
      },
      [&] { return verdict_ == Verdict::kUndecided; });
  return verdict_;
}

void TokenRecognizer::frameDone() {
  if (!collecting_) return;
  const unsigned char type = type_, flags = flags_;
  std::size_t begin = 0, end = frame_.size();
  if (type == kHeaders) {
    block_.clear();
    if (flags & kPadded) {
      if (end < 1 || frame_[0] >= end) {
        verdict_ = Verdict::kGaveUp;
        return;
      }
      end -= frame_[0];
      begin = 1;
    }
    if (flags & kPriorityFlag) begin += 5;
    if (begin > end) {
      verdict_ = Verdict::kGaveUp;
      return;
    }
  }
  block_.insert(block_.end(), frame_.begin() + static_cast<std::ptrdiff_t>(begin),
                frame_.begin() + static_cast<std::ptrdiff_t>(end));
  if (block_.size() > kMaxBlockBytes) {
    verdict_ = Verdict::kGaveUp;
    return;
  }
  inBlock_ = !(flags & kEndHeaders);
  if (!inBlock_) decodeBlock();
}

void TokenRecognizer::decodeBlock() {
  const uint8_t* in = block_.data();
  std::size_t left = block_.size();
  for (;;) {
    nghttp2_nv nv;
    int flags = 0;
    const ssize_t used = nghttp2_hd_inflate_hd2(inflater_->hd, &nv, &flags, in, left, 1);
    if (used < 0) {
      verdict_ = Verdict::kGaveUp;
      return;
    }
    in += used;
    left -= static_cast<std::size_t>(used);
    if ((flags & NGHTTP2_HD_INFLATE_EMIT) && nv.namelen == key_.size() &&
        std::equal(key_.begin(), key_.end(), nv.name) && constantTimeEquals(std::string_view(reinterpret_cast<const char*>(nv.value), nv.valuelen), token_)) {
      verdict_ = Verdict::kFound;
      return;
    }
    if (flags & NGHTTP2_HD_INFLATE_FINAL) {
      nghttp2_hd_inflate_end_headers(inflater_->hd);
      break;
    }
    if (!(flags & NGHTTP2_HD_INFLATE_EMIT) && left == 0) break;
  }
  block_.clear();
  if (++blocks_ >= kMaxBlocks) verdict_ = Verdict::kGaveUp;
}

}  // namespace ddprun
