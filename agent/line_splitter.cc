#include "agent/line_splitter.h"

namespace ddprun {

void LineSplitter::feed(std::string_view bytes, const LineHandler& onLine) {
  while (!bytes.empty()) {
    size_t eol = bytes.find('\n');
    if (eol == std::string_view::npos) {
      partial_.append(bytes);
      while (partial_.size() >= maxLineBytes_) {
        onLine(std::string_view(partial_).substr(0, maxLineBytes_));
        partial_.erase(0, maxLineBytes_);
      }
      return;
    }
    std::string_view piece = bytes.substr(0, eol);
    if (partial_.empty()) {
      onLine(piece);  // common case: no copy
    } else {
      partial_.append(piece);
      onLine(partial_);
      partial_.clear();
    }
    bytes.remove_prefix(eol + 1);
  }
}

void LineSplitter::finish(const LineHandler& onLine) {
  if (partial_.empty()) return;
  onLine(partial_);
  partial_.clear();
}

}  // namespace ddprun
