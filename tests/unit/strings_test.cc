#include "common/strings.h"

#include <catch2/catch.hpp>
#include <limits>

using ddprun::parseInt;
using ddprun::parseSeconds;
using ddprun::split;
using ddprun::trim;

TEST_CASE("parseInt accepts whole decimal integers", "[strings]") {
  CHECK(parseInt("0") == 0);
  CHECK(parseInt("12") == 12);
  CHECK(parseInt("-3") == -3);
  CHECK(parseInt("9223372036854775807") == std::numeric_limits<int64_t>::max());
  CHECK(parseInt("-9223372036854775808") == std::numeric_limits<int64_t>::min());
}

TEST_CASE("parseInt rejects trailing garbage, empty text and overflow", "[strings]") {
  CHECK_FALSE(parseInt("12abc").has_value());
  CHECK_FALSE(parseInt("abc").has_value());
  CHECK_FALSE(parseInt("").has_value());
  CHECK_FALSE(parseInt("-").has_value());
  CHECK_FALSE(parseInt(" 12").has_value());
  CHECK_FALSE(parseInt("12 ").has_value());
  CHECK_FALSE(parseInt("1.5").has_value());
  CHECK_FALSE(parseInt("0x10").has_value());
  CHECK_FALSE(parseInt("9223372036854775808").has_value());
  CHECK_FALSE(parseInt("99999999999999999999999").has_value());
  CHECK_FALSE(parseInt("-9223372036854775809").has_value());
}

TEST_CASE("parseSeconds accepts non-negative numbers", "[strings]") {
  CHECK(parseSeconds("30") == 30.0);
  CHECK(parseSeconds("0") == 0.0);
  CHECK(parseSeconds("0.5") == 0.5);
  CHECK(parseSeconds("1.25") == 1.25);
}

TEST_CASE("parseSeconds rejects negatives, signs, garbage and non-finite values", "[strings]") {
  CHECK_FALSE(parseSeconds("-1").has_value());
  CHECK_FALSE(parseSeconds("+1").has_value());
  CHECK_FALSE(parseSeconds("").has_value());
  CHECK_FALSE(parseSeconds("abc").has_value());
  CHECK_FALSE(parseSeconds("1s").has_value());
  CHECK_FALSE(parseSeconds("1.5.2").has_value());
  CHECK_FALSE(parseSeconds("inf").has_value());
  CHECK_FALSE(parseSeconds("nan").has_value());
  CHECK_FALSE(parseSeconds("1e999").has_value());
}

TEST_CASE("split keeps empty fields", "[strings]") {
  CHECK(split("a,b,c", ',') == std::vector<std::string>{"a", "b", "c"});
  CHECK(split("", ',') == std::vector<std::string>{""});
  CHECK(split("a", ',') == std::vector<std::string>{"a"});
  CHECK(split(",a,,b,", ',') == std::vector<std::string>{"", "a", "", "b", ""});
  CHECK(split("0:1", ':') == std::vector<std::string>{"0", "1"});
}

TEST_CASE("trim removes surrounding blanks only", "[strings]") {
  CHECK(trim("  a b \t\r\n") == "a b");
  CHECK(trim("abc") == "abc");
  CHECK(trim("").empty());
  CHECK(trim(" \t\n ").empty());
  CHECK(trim("\tx") == "x");
}

TEST_CASE("startsWith and endsWith", "[strings]") {
  CHECK(ddprun::startsWith("SIGTERM", "SIG"));
  CHECK_FALSE(ddprun::startsWith("SI", "SIG"));
  CHECK(ddprun::endsWith("train.py", ".py"));
  CHECK_FALSE(ddprun::endsWith("py", ".py"));
  CHECK_FALSE(ddprun::endsWith("train.pyc", ".py"));
}

TEST_CASE("oneLine escapes control characters only", "[strings]") {
  CHECK(ddprun::oneLine("a\nb\rc\x1b[31m") == "a\\x0ab\\x0dc\\x1b[31m");
  CHECK(ddprun::oneLine("path\\x0a stays, caf\xc3\xa9 too") == "path\\x0a stays, caf\xc3\xa9 too");
}
