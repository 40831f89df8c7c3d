// Fuzz target: endpoint parsing (parseEndpoint, joinHostPort), id and host validation (idProblem,
// hostProblem) and printable(), on the raw input as one string.
// Properties: parseEndpoint throws nothing but ConfigError and returns a non-empty host and a port
// in 0..65535; a valid host survives joinHostPort -> parseEndpoint unchanged; idProblem and
// hostProblem agree with independent oracles and their messages are short and printable;
// printable() emits printable ASCII only, bounded by its limit, and decodes back to the input.
#include <arpa/inet.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "common/error.h"
#include "common/ids.h"
#include "common/net.h"
#include "common/strings.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

bool isPrintableAscii(std::string_view text) {
  for (unsigned char c : text) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

bool isAsciiAlnum(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

bool oracleIdOk(std::string_view id) {
  if (id.empty() || id.size() > ddprun::kMaxIdBytes) return false;
  for (unsigned char c : id) {
    if (!isAsciiAlnum(c) && std::string_view("._:@+=-").find(static_cast<char>(c)) == std::string_view::npos) {
      return false;
    }
  }
  return true;
}

bool oracleHostOk(std::string_view host) {
  if (host.empty() || host.size() > 253) return false;
  if (host.find(':') != std::string_view::npos) {
    // Only an IPv6 address has a colon; the whole string must be one (no NUL cutting it short).
    if (host.find('\0') != std::string_view::npos) return false;
    unsigned char buf[16];
    return ::inet_pton(AF_INET6, std::string(host).c_str(), buf) == 1;
  }
  std::size_t start = 0;
  while (true) {  // RFC 1123 labels
    std::size_t end = host.find('.', start);
    if (end == std::string_view::npos) end = host.size();
    std::string_view label = host.substr(start, end - start);
    if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-') return false;
    for (unsigned char c : label) {
      if (!isAsciiAlnum(c) && c != '-') return false;
    }
    if (end == host.size()) return true;
    start = end + 1;
  }
}

// Checks printable(text, maxBytes): printable ASCII, bounded, and decodable back to the input.
void checkPrintable(std::string_view text, std::size_t maxBytes) {
  const std::string out = ddprun::printable(text, maxBytes);
  FUZZ_CHECK(isPrintableAscii(out), "printable() emitted a byte outside printable ASCII");
  const std::size_t shown = std::min(text.size(), maxBytes);
  FUZZ_CHECK(out.size() <= 4 * shown + 32, "printable() output is not bounded by its limit");
  std::string decoded;
  std::size_t i = 0;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  while (decoded.size() < shown) {
    FUZZ_CHECK(i < out.size(), "printable() output ends before the input's shown bytes");
    if (out[i] == '\\') {
      FUZZ_CHECK(i + 4 <= out.size() && out[i + 1] == 'x' && hex(out[i + 2]) >= 0 && hex(out[i + 3]) >= 0,
                 "printable() emitted a backslash that is not a \\xNN escape");
      decoded += static_cast<char>(hex(out[i + 2]) * 16 + hex(out[i + 3]));
      i += 4;
    } else {
      decoded += out[i++];
    }
  }
  FUZZ_CHECK(decoded == text.substr(0, shown), "printable() does not decode back to its input");
  const std::string tail = shown < text.size() ? "... (+" + std::to_string(text.size() - shown) + " bytes)" : "";
  FUZZ_CHECK(out.substr(i) == tail, "printable() has a wrong or missing cut marker");
}

void checkProblemMessage(const std::optional<std::string>& problem) {
  if (!problem) return;
  FUZZ_CHECK(!problem->empty() && problem->size() <= 96 && isPrintableAscii(*problem),
             "a validation message is empty, long or not printable: " + ddprun::printable(*problem));
}

// parseEndpoint(endpoint) -> its result, or nullopt for a ConfigError; anything else fails.
std::optional<std::pair<std::string, int>> parse(const std::string& endpoint, int defaultPort) {
  try {
    auto result = ddprun::parseEndpoint(endpoint, defaultPort);
    FUZZ_CHECK(!result.first.empty(), "parseEndpoint returned an empty host for '" + ddprun::printable(endpoint) + "'");
    FUZZ_CHECK(result.second >= 0 && result.second <= 65535,
               "parseEndpoint returned port " + std::to_string(result.second));
    return result;
  } catch (const ddprun::ConfigError&) {
    return std::nullopt;
  } catch (const std::exception& e) {
    ddprun::fuzz::fail(__FILE__, __LINE__, std::string("parseEndpoint threw a non-ConfigError: ") + e.what());
  }
}

void checkRoundTrip(const std::string& host, int port) {
  const std::string joined = ddprun::joinHostPort(host, port);
  auto again = parse(joined, 1);
  FUZZ_CHECK(again && again->first == host && again->second == port,
             "host '" + ddprun::printable(host) + "' port " + std::to_string(port) + " did not survive '" +
                 ddprun::printable(joined) + "'");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);

  for (std::size_t limit : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{64}, std::size_t{128},
                            text.size()}) {
    checkPrintable(text, limit);
  }

  const auto idIssue = ddprun::idProblem(text);
  FUZZ_CHECK(!idIssue == oracleIdOk(text), "idProblem disagrees with the oracle on '" + ddprun::printable(text) + "'");
  checkProblemMessage(idIssue);

  const auto hostIssue = ddprun::hostProblem(text);
  FUZZ_CHECK(!hostIssue == oracleHostOk(text),
             "hostProblem disagrees with the oracle on '" + ddprun::printable(text) + "' (accepted: " +
                 (hostIssue ? "no" : "yes") + ")");
  checkProblemMessage(hostIssue);

  const int defaultPort = 29400;
  if (auto result = parse(text, defaultPort)) {
    if (text.find(':') == std::string::npos && text.find('[') == std::string::npos) {
      FUZZ_CHECK(result->first == text && result->second == defaultPort,
                 "an endpoint without a port changed: '" + ddprun::printable(text) + "'");
    }
    if (!ddprun::hostProblem(result->first)) checkRoundTrip(result->first, result->second);
  }
  if (!hostIssue) checkRoundTrip(text, static_cast<int>(size * 7919 % 65536));
  return 0;
}
