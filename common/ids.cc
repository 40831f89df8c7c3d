#include "common/ids.h"

#include <arpa/inet.h>

#include <cctype>

namespace ddprun {
namespace {

bool idChar(unsigned char c) {
  return std::isalnum(c) || c == '.' || c == '_' || c == ':' || c == '@' || c == '+' || c == '=' || c == '-';
}

bool isAddress(std::string_view host) {
  // inet_pton reads a C string: a NUL would end the address early and let anything follow it.
  if (host.find('\0') != std::string_view::npos) return false;
  std::string text(host);
  unsigned char buf[sizeof(in6_addr)];
  return ::inet_pton(AF_INET, text.c_str(), buf) == 1 || ::inet_pton(AF_INET6, text.c_str(), buf) == 1;
}

}  // namespace

std::optional<std::string> idProblem(std::string_view id) {
  if (id.empty()) return "is empty";
  if (id.size() > kMaxIdBytes) {
    return "is " + std::to_string(id.size()) + " bytes, more than " + std::to_string(kMaxIdBytes);
  }
  for (unsigned char c : id) {
    if (!idChar(c)) return "may hold only letters, digits and . _ : @ + = -";
  }
  return std::nullopt;
}

std::optional<std::string> hostProblem(std::string_view host) {
  if (host.empty()) return "is empty";
  if (host.size() > 253) return "is longer than 253 bytes";
  if (host.find(':') != std::string_view::npos) {
    return isAddress(host) ? std::nullopt : std::optional<std::string>("is neither a hostname nor an IP address");
  }
  std::size_t start = 0;
  while (start <= host.size()) {
    std::size_t end = host.find('.', start);
    if (end == std::string_view::npos) end = host.size();
    std::string_view label = host.substr(start, end - start);
    if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-') {
      return "is not a hostname (RFC 1123) or an IP address";
    }
    for (unsigned char c : label) {
      if (!std::isalnum(c) && c != '-') return "is not a hostname (RFC 1123) or an IP address";
    }
    start = end + 1;
  }
  return std::nullopt;
}

}  // namespace ddprun
