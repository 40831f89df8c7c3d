#include "agent/json_value.h"

#include <catch2/catch.hpp>

using ddprun::json::parse;

TEST_CASE("json: objects, arrays and scalars", "[agent][json]") {
  auto v = parse(R"( {"a": 1.5, "b": [true, false, null, -0, 2e3], "c": {"d": "x"}, "e": {}, "f": []} )");
  REQUIRE(v.has_value());
  REQUIRE(v->member("a"));
  CHECK(*v->member("a")->asNumber() == 1.5);
  const auto& b = std::get<ddprun::json::Array>(v->member("b")->data);
  REQUIRE(b.size() == 5);
  CHECK(std::get<bool>(b[0].data));
  CHECK_FALSE(std::get<bool>(b[1].data));
  CHECK(std::holds_alternative<std::monostate>(b[2].data));
  CHECK(*b[4].asNumber() == 2000.0);
  CHECK(*v->member("c")->member("d")->asString() == "x");
  CHECK(v->member("e")->asObject()->empty());
  CHECK(v->member("missing") == nullptr);
  CHECK(v->member("a")->member("x") == nullptr);  // not an object
}

TEST_CASE("json: string escapes, unicode and surrogate pairs", "[agent][json]") {
  auto v = parse(R"({"s": "q\" b\\ s\/ \b\f\n\r\t \u00e9 \u20ac \ud83d\ude00 raw-é"})");
  REQUIRE(v.has_value());
  CHECK(*v->member("s")->asString() == "q\" b\\ s/ \b\f\n\r\t \xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80 raw-\xC3\xA9");
}

TEST_CASE("json: the last of duplicate members wins", "[agent][json]") {
  auto v = parse(R"({"k": 1, "k": 2})");
  REQUIRE(v.has_value());
  CHECK(*v->member("k")->asNumber() == 2.0);
}

TEST_CASE("json: invalid documents are refused", "[agent][json]") {
  const char* bad[] = {
      "",           "{",           "}",          "{\"a\" 1}",     "{\"a\":}",       "{\"a\":1,}",
      "[1,]",       "[1 2]",       "{a:1}",      "'x'",           "\"unterminated", "\"bad \\x escape\"",
      "\"\\u12\"",  "\"\\ud83d\"", "\"\\ude00\"", "01",           "1.",             "-",
      "1e",         "tru",         "nul",        "{} {}",        "\"tab\there\"",  "+1",
  };
  for (const char* text : bad) {
    INFO(text);
    CHECK_FALSE(parse(text).has_value());
  }
}

TEST_CASE("json: nesting is bounded, so a hostile file cannot exhaust the stack", "[agent][json]") {
  CHECK(parse(std::string(100, '[') + std::string(100, ']')).has_value());
  CHECK_FALSE(parse(std::string(100000, '[') + std::string(100000, ']')).has_value());
}
