// Fuzz target: Slurm hostlist expansion (launcher/scheduler/slurm_hostlist.h) on the raw input as
// one expression, once with the real bound and once with a small one.
// Properties: only ConfigError escapes, with a short printable message; never more hosts than the
// bound (the bound is checked before anything is built, so "n[0-99999999]" costs nothing); every
// host is non-empty and holds no separator and no bracket; an expression without brackets
// expands to its separated words, in order; under a small bound, the answer is the real one or
// a ConfigError.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "common/strings.h"
#include "launcher/scheduler/slurm_hostlist.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

constexpr std::string_view kSeparators = ", \t\n";

bool isPrintableAscii(std::string_view text) {
  for (unsigned char c : text) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

// expandSlurmHostlist -> its hosts, or nullopt for a ConfigError; anything else fails.
std::optional<std::vector<std::string>> expand(const std::string& text, std::size_t maxHosts) {
  try {
    auto hosts = ddprun::expandSlurmHostlist(text, maxHosts);
    FUZZ_CHECK(hosts.size() <= maxHosts, "more hosts than the bound for '" + ddprun::printable(text) + "'");
    for (const auto& host : hosts) {
      FUZZ_CHECK(!host.empty() && host.find_first_of(std::string(kSeparators) + "[]") == std::string::npos,
                 "host '" + ddprun::printable(host) + "' from '" + ddprun::printable(text) + "'");
    }
    return hosts;
  } catch (const ddprun::ConfigError& e) {
    std::string_view what = e.what();
    FUZZ_CHECK(!what.empty() && what.size() <= 600 && isPrintableAscii(what),
               "a hostlist error is empty, long or not printable: " + ddprun::printable(what));
    return std::nullopt;
  } catch (const std::exception& e) {
    ddprun::fuzz::fail(__FILE__, __LINE__, std::string("expandSlurmHostlist threw a non-ConfigError: ") + e.what());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto full = expand(text, ddprun::kMaxHostlistHosts);

  if (text.find_first_of("[]") == std::string::npos) {
    std::vector<std::string> words;
    std::string word;
    for (char c : text + ",") {
      if (kSeparators.find(c) == std::string_view::npos) {
        word += c;
      } else if (!word.empty()) {
        words.push_back(word);
        word.clear();
      }
    }
    FUZZ_CHECK(words.size() > ddprun::kMaxHostlistHosts ? !full : (full && *full == words),
               "a list without brackets is not its words: '" + ddprun::printable(text) + "'");
  }

  auto small = expand(text, 8);
  if (small) FUZZ_CHECK(full && *full == *small, "a small bound changed the answer for '" + ddprun::printable(text) + "'");
  if (full && full->size() <= 8) FUZZ_CHECK(small, "a small bound refused a short answer for '" + ddprun::printable(text) + "'");
  return 0;
}
