// torchrun's error file read with Boost.JSON (agent/error_file.h): the formats @record writes,
// escapes and unicode, and everything a worker might leave there instead, bounded.
#include "agent/error_file.h"

#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <string>

#include "test_util.h"

using Catch::Matchers::Contains;
using ddprun::readErrorFile;
using ddprun::test::TempDir;
using ddprun::test::writeFile;

TEST_CASE("readErrorFile reads torchrun's nested JSON format", "[agent][report]") {
  TempDir dir;
  const std::string path = dir.file("error.json");
  writeFile(path,
            R"({"message": {"message": "ValueError: boom", "extraInfo": {"py_callstack": )"
            R"("Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\nValueError: boom\n", )"
            R"("timestamp": "1700000000"}}})");
  auto content = readErrorFile(path);
  REQUIRE(content.has_value());
  CHECK(content->message == "ValueError: boom");
  CHECK(content->traceback ==
        "Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\nValueError: boom\n");
  CHECK(content->timestamp == "1700000000");
}

TEST_CASE("readErrorFile accepts a numeric timestamp", "[agent][report]") {
  TempDir dir;
  const std::string path = dir.file("error.json");
  writeFile(path, R"({"message": {"message": "RuntimeError: x", "extraInfo": {"timestamp": 1700000001}}})");
  auto content = readErrorFile(path);
  REQUIRE(content.has_value());
  CHECK(content->message == "RuntimeError: x");
  CHECK(content->timestamp == "1700000001");
  CHECK(content->traceback.empty());
}

TEST_CASE("readErrorFile reads a plain message", "[agent][report]") {
  TempDir dir;
  const std::string path = dir.file("error.json");
  writeFile(path, R"({"message": "plain"})");
  auto content = readErrorFile(path);
  REQUIRE(content.has_value());
  CHECK(content->message == "plain");
  CHECK(content->traceback.empty());
}

TEST_CASE("readErrorFile returns text that is not such JSON as it is", "[agent][report]") {
  TempDir dir;
  const std::string path = dir.file("error.json");
  writeFile(path, "  worker wrote this, not JSON\n");
  auto content = readErrorFile(path);
  REQUIRE(content.has_value());
  CHECK(content->message == "worker wrote this, not JSON");

  writeFile(path, R"({"other": 1})");
  content = readErrorFile(path);
  REQUIRE(content.has_value());
  CHECK(content->message == R"({"other": 1})");
}

TEST_CASE("readErrorFile gives nullopt for a missing or empty file", "[agent][report]") {
  TempDir dir;
  CHECK_FALSE(readErrorFile(dir.file("missing.json")).has_value());
  CHECK_FALSE(readErrorFile("").has_value());
  writeFile(dir.file("empty.json"), " \n");
  CHECK_FALSE(readErrorFile(dir.file("empty.json")).has_value());
}

TEST_CASE("readErrorFile: escapes, unicode and surrogate pairs in the message", "[agent][report]") {
  TempDir dir;
  writeFile(dir.file("e.json"),
            R"({"message": {"message": "q\" b\\ s\/ \n\t \u00e9 \u20ac \ud83d\ude00 raw-\u00e9", "extraInfo": {}}})");
  auto content = readErrorFile(dir.file("e.json"));
  REQUIRE(content.has_value());
  CHECK(content->message == "q\" b\\ s/ \n\t \xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80 raw-\xC3\xA9");
}

TEST_CASE("readErrorFile: invalid JSON of every kind is shown as the raw text", "[agent][report]") {
  TempDir dir;
  const char* bad[] = {
      "{",        "{\"message\" 1}", "{\"message\":}", "{\"message\":1,}", "[1,]",          "{message:1}",
      "'x'",      "\"unterminated", "\"bad \\x escape\"", "\"\\u12\"", "01",           "1.",
      "tru",      "{} {}",          "+1",
  };
  for (const char* text : bad) {
    INFO(text);
    writeFile(dir.file("e.json"), text);
    auto content = readErrorFile(dir.file("e.json"));
    REQUIRE(content.has_value());
    CHECK(content->message == text);
    CHECK(content->traceback.empty());
  }
}

TEST_CASE("readErrorFile: other shapes (an array, a number, fields of other types) fall back to the text",
          "[agent][report]") {
  TempDir dir;
  for (const char* text : {"[1, 2]", "42", "\"just a string\"", R"({"message": ["a"]})", R"({"message": null})"}) {
    INFO(text);
    writeFile(dir.file("e.json"), text);
    auto content = readErrorFile(dir.file("e.json"));
    REQUIRE(content.has_value());
    CHECK(content->message == text);
  }
  writeFile(dir.file("e.json"), R"({"message": 7})");
  CHECK(readErrorFile(dir.file("e.json"))->message == "7");
}

TEST_CASE("readErrorFile: nesting is bounded, so a hostile file cannot exhaust the stack", "[agent][report]") {
  TempDir dir;
  writeFile(dir.file("e.json"), R"({"message": {"message": "deep ok", "extraInfo": {"a": )" + std::string(40, '[') +
                                    std::string(40, ']') + "}}}");
  CHECK(readErrorFile(dir.file("e.json"))->message == "deep ok");
  writeFile(dir.file("e.json"), std::string(100000, '[') + std::string(100000, ']'));
  auto content = readErrorFile(dir.file("e.json"));
  REQUIRE(content.has_value());
  CHECK(content->message.size() < ddprun::kMaxErrorMessageShown + 100);  // the raw text, cut
  CHECK_THAT(content->message, Contains("(+"));
}

TEST_CASE("readErrorFile: a huge file is read only in part, and what is shown is bounded", "[agent][report]") {
  TempDir dir;
  const std::string traceback(200 * 1024, 't');
  writeFile(dir.file("e.json"), R"({"message": {"message": ")" + std::string(10000, 'm') +
                                    R"(", "extraInfo": {"py_callstack": ")" + traceback + R"("}}})");
  auto content = readErrorFile(dir.file("e.json"));
  REQUIRE(content.has_value());
  CHECK(content->message.size() < ddprun::kMaxErrorMessageShown + 100);
  CHECK(content->traceback.size() < ddprun::kMaxTracebackShown + 100);
  CHECK_THAT(content->traceback, Contains("(+"));

  writeFile(dir.file("big.json"), std::string(3 << 20, 'x'));  // 3 MiB: past the read limit
  auto big = readErrorFile(dir.file("big.json"));
  REQUIRE(big.has_value());
  CHECK(big->message.size() < ddprun::kMaxErrorMessageShown + 100);
  CHECK_THAT(big->message, Contains("file of 3145728 bytes"));
}

TEST_CASE("readErrorFile: a FIFO or a folder is no error file, and reading it does not block", "[agent][report]") {
  TempDir dir;
  REQUIRE(::mkfifo(dir.file("fifo").c_str(), 0600) == 0);
  CHECK_FALSE(readErrorFile(dir.file("fifo")).has_value());
  CHECK_FALSE(readErrorFile(dir.path()).has_value());
}
