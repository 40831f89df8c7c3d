// Small string helpers with strict parsing: "12abc" is not a number.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun {

std::vector<std::string> split(std::string_view text, char sep);
std::string_view trim(std::string_view text);
bool startsWith(std::string_view text, std::string_view prefix);
bool endsWith(std::string_view text, std::string_view suffix);

// Whole-string decimal integer, optional leading '-'; nullopt on anything else or overflow.
std::optional<int64_t> parseInt(std::string_view text);
// Whole-string non-negative decimal number, such as "30" or "0.5"; nullopt otherwise.
std::optional<double> parseSeconds(std::string_view text);

// `text` made safe for a log line or an error message: bytes outside printable ASCII become \xNN,
// and past `maxBytes` of input the rest is cut, saying how much ("... (+N bytes)"). Everything a
// peer sends goes through it before it is logged or echoed.
std::string printable(std::string_view text, std::size_t maxBytes = 128);

// `text` on one line: control characters (newlines, carriage returns, escape sequences) become
// \xNN, everything else stays as it is. For a message of ddprun's own that quotes a value already
// made printable or one that may hold any byte: it cannot forge a second line.
std::string oneLine(std::string_view text);

}  // namespace ddprun
