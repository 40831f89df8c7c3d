// Reading a fuzz input as a stream of small decisions: bytes, integers, strings. Past the end every
// read returns zero or empty, so a target decodes any input, however short.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace ddprun::fuzz {

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, std::size_t size) : data_(data), size_(size) {}

  bool empty() const { return pos_ >= size_; }

  uint8_t byte() { return empty() ? 0 : data_[pos_++]; }
  uint16_t u16() { return static_cast<uint16_t>(byte() | byte() << 8); }
  uint32_t u32() { return static_cast<uint32_t>(u16()) | static_cast<uint32_t>(u16()) << 16; }
  uint64_t u64() { return static_cast<uint64_t>(u32()) | static_cast<uint64_t>(u32()) << 32; }
  bool flag() { return byte() & 1; }

  // A value in [0, n) for n > 0.
  std::size_t below(std::size_t n) { return n <= 256 ? byte() % n : u32() % n; }

  template <typename T>
  const T& pick(const std::vector<T>& choices) {
    return choices[below(choices.size())];
  }

  // Up to `maxLen` bytes, the length taken from the input first.
  std::string bytes(std::size_t maxLen) {
    std::size_t n = maxLen <= 255 ? byte() : u16();
    if (n > maxLen) n %= maxLen + 1;
    if (n > size_ - pos_ && !empty()) n = size_ - pos_;
    if (empty()) n = 0;
    std::string out(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return out;
  }

 private:
  const uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

// A violated property: prints what and where, then aborts, which libFuzzer and the replay driver
// report as a crash.
[[noreturn]] inline void fail(const char* file, int line, const std::string& what) {
  std::fprintf(stderr, "%s:%d: fuzz property violated: %s\n", file, line, what.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace ddprun::fuzz

#define FUZZ_CHECK(cond, what)                                           \
  do {                                                                   \
    if (!(cond)) ::ddprun::fuzz::fail(__FILE__, __LINE__, (what));       \
  } while (0)
