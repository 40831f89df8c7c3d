#include "agent/filtered_log.h"

#include <fcntl.h>

#include <algorithm>

#include "common/error.h"

namespace ddprun {

FilteredLog::FilteredLog(const std::string& path, std::vector<std::string> needles)
    : needles_(std::move(needles)), fd_(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644)) {
  if (!fd_) throw DDPRUN_SYSTEM_ERROR("cannot open " + path);
}

bool FilteredLog::matches(std::string_view line) const {
  return std::any_of(needles_.begin(), needles_.end(),
                     [&](const std::string& needle) { return line.find(needle) != std::string_view::npos; });
}

void FilteredLog::write(std::string_view lines) { writeAll(fd_.get(), lines); }

std::vector<std::string> FilteredLog::parseList(const std::string& text) {
  std::vector<std::string> items;
  std::string item;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != ',') {
      item.push_back(text[i]);
    } else if (i + 1 < text.size() && text[i + 1] == ',') {
      item.push_back(',');
      ++i;
    } else {
      if (!item.empty()) items.push_back(std::move(item));
      item.clear();
    }
  }
  if (!item.empty()) items.push_back(std::move(item));
  return items;
}

}  // namespace ddprun
