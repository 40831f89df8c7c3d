#include "common/strings.h"

#include <algorithm>
#include <charconv>
#include <cmath>

namespace ddprun {

std::vector<std::string> split(std::string_view text, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t pos = text.find(sep, start);
    parts.emplace_back(text.substr(start, pos == std::string_view::npos ? pos : pos - start));
    if (pos == std::string_view::npos) return parts;
    start = pos + 1;
  }
}

std::string_view trim(std::string_view text) {
  const char* ws = " \t\r\n";
  size_t begin = text.find_first_not_of(ws);
  if (begin == std::string_view::npos) return {};
  size_t end = text.find_last_not_of(ws);
  return text.substr(begin, end - begin + 1);
}

bool startsWith(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}

bool endsWith(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

std::optional<int64_t> parseInt(std::string_view text) {
  if (text.empty()) return std::nullopt;
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

std::optional<double> parseSeconds(std::string_view text) {
  if (text.empty() || text[0] == '-' || text[0] == '+') return std::nullopt;
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}


std::string oneLine(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (char ch : text) {
    auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7f) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    } else {
      out += ch;
    }
  }
  return out;
}

std::string printable(std::string_view text, std::size_t maxBytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  const std::size_t shown = std::min(text.size(), maxBytes);
  out.reserve(shown + 16);
  for (std::size_t i = 0; i < shown; ++i) {
    auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    }
  }
  if (shown < text.size()) out += "... (+" + std::to_string(text.size() - shown) + " bytes)";
  return out;
}

}  // namespace ddprun
