// Cuts a byte stream into whole lines. A worker's output arrives in arbitrary chunks; only whole
// lines may be prefixed and written, so that no line is ever cut in half or mixed with another.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace ddprun {

class LineSplitter {
 public:
  // Receives each line without its '\n'.
  using LineHandler = std::function<void(std::string_view line)>;

  // A line longer than maxLineBytes (a worker printing without newlines) is emitted in pieces of
  // that size, so memory stays bounded.
  explicit LineSplitter(size_t maxLineBytes = 1 << 20) : maxLineBytes_(maxLineBytes) {}

  void feed(std::string_view bytes, const LineHandler& onLine);
  // End of stream: emits the unfinished last line, if any.
  void finish(const LineHandler& onLine);

 private:
  size_t maxLineBytes_;
  std::string partial_;
  bool cutLine_ = false;  // the current line was already emitted in pieces
};

}  // namespace ddprun
