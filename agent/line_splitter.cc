#include "agent/line_splitter.h"

namespace ddprun {

void LineSplitter::feed(std::string_view bytes, const LineHandler& onLine) {
  while (!bytes.empty()) {
    size_t eol = bytes.find('\n');
    if (eol != std::string_view::npos && partial_.empty() && !cutLine_ && eol <= maxLineBytes_) {
      onLine(bytes.substr(0, eol));  // common case: a whole line in one chunk, no copy
      bytes.remove_prefix(eol + 1);
      continue;
    }
    partial_.append(bytes.substr(0, eol));
    // Strictly longer than the limit: a line of exactly maxLineBytes stays one line.
    while (partial_.size() > maxLineBytes_) {
      onLine(std::string_view(partial_).substr(0, maxLineBytes_));
      partial_.erase(0, maxLineBytes_);
      cutLine_ = true;
    }
    if (eol == std::string_view::npos) return;
    // The rest of the line; nothing when a cut line ended exactly at a piece boundary.
    if (!partial_.empty() || !cutLine_) onLine(partial_);
    partial_.clear();
    cutLine_ = false;
    bytes.remove_prefix(eol + 1);
  }
}

void LineSplitter::finish(const LineHandler& onLine) {
  if (!partial_.empty()) onLine(partial_);
  partial_.clear();
  cutLine_ = false;
}

}  // namespace ddprun
