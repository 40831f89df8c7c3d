#include "store/wire/store_wire.h"

#include <algorithm>
#include <cstring>

namespace ddprun::storewire {

void appendFrame(std::string& out, const google::protobuf::MessageLite& message) {
  const std::size_t size = message.ByteSizeLong();
  const std::size_t at = out.size();
  out.resize(at + kHeaderBytes + size);
  auto* p = reinterpret_cast<unsigned char*>(out.data() + at);
  p[0] = static_cast<unsigned char>(size >> 24);
  p[1] = static_cast<unsigned char>(size >> 16);
  p[2] = static_cast<unsigned char>(size >> 8);
  p[3] = static_cast<unsigned char>(size);
  message.SerializeWithCachedSizesToArray(p + kHeaderBytes);
}

void FrameReader::toFront() {
  if (begin_ == 0) return;
  std::memmove(buf_.data(), buf_.data() + begin_, end_ - begin_);
  end_ -= begin_;
  begin_ = 0;
}

char* FrameReader::room(std::size_t want) {
  constexpr std::size_t kKeptBytes = 1 << 20;
  if (begin_ == end_) {
    begin_ = end_ = 0;
    // After a large value: give its memory back rather than hold it for the connection's life.
    if (buf_.size() > kKeptBytes && want <= kKeptBytes) std::string().swap(buf_);
  }
  if (buf_.size() - end_ < want) {
    // Move what is left to the front first: a buffer that only grew would keep the largest
    // frame's size for good.
    toFront();
    if (buf_.size() - end_ < want) buf_.resize(end_ + want);
  }
  return buf_.data() + end_;
}

void FrameReader::append(const char* data, std::size_t n) {
  // room() makes exactly what is held: resize writes every byte it adds, so slack would be memory
  // in use (std::string's capacity still grows geometrically, untouched).
  std::memcpy(room(n), data, n);
  end_ += n;
}

void FrameReader::compact() {
  if (begin_ == end_) {
    begin_ = end_ = 0;
    std::string().swap(buf_);
    return;
  }
  toFront();
  buf_.resize(end_);
  if (buf_.capacity() > 2 * buf_.size() + 4096) buf_.shrink_to_fit();
}

std::size_t FrameReader::pendingFrameBytes() const {
  if (buffered() < kHeaderBytes) return 0;
  const auto* p = reinterpret_cast<const unsigned char*>(buf_.data() + begin_);
  return kHeaderBytes + ((std::size_t{p[0]} << 24) | (std::size_t{p[1]} << 16) | (std::size_t{p[2]} << 8) | p[3]);
}

std::string_view FrameReader::take(std::size_t n) {
  n = std::min(n, buffered());
  std::string_view out(buf_.data() + begin_, n);
  begin_ += n;
  return out;
}

FrameReader::Next FrameReader::next(std::string_view& payload) {
  if (buffered() < kHeaderBytes) return Next::kNeedMore;
  const std::size_t size = pendingFrameBytes() - kHeaderBytes;
  if (size > max_) return Next::kTooLarge;
  if (buffered() < kHeaderBytes + size) return Next::kNeedMore;
  payload = std::string_view(buf_.data() + begin_ + kHeaderBytes, size);
  begin_ += kHeaderBytes + size;
  return Next::kFrame;
}

}  // namespace ddprun::storewire
