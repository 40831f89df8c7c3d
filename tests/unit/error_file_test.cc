#include "agent/error_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <future>

#include "common/strings.h"
#include "test_util.h"

using ddprun::kMaxErrorFileBytes;
using ddprun::kMaxErrorMessageShown;
using ddprun::kMaxTracebackShown;
using ddprun::readErrorFile;
using ddprun::test::TempDir;
using ddprun::test::writeFile;

namespace {

// What readErrorFile makes of `text` written to a fresh file.
std::optional<ddprun::ErrorFileContent> readText(const std::string& text) {
  TempDir dir;
  writeFile(dir.file("error.json"), text);
  return readErrorFile(dir.file("error.json"));
}

// The message of a file holding `text`; "(nullopt)" when there is none.
std::string messageOf(const std::string& text) {
  auto content = readText(text);
  return content ? content->message : "(nullopt)";
}

const std::string kTorchrunFile =
    R"({"message": {"message": "ValueError: boom", "extraInfo": {"py_callstack": )"
    R"("Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\nValueError: boom\n", )"
    R"("timestamp": "1700000000"}}})";

}  // namespace

TEST_CASE("readErrorFile reads torchrun's nested JSON format", "[agent][error_file]") {
  auto content = readText(kTorchrunFile);
  REQUIRE(content.has_value());
  CHECK(content->message == "ValueError: boom");
  CHECK(content->traceback ==
        "Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\nValueError: boom\n");
  CHECK(content->timestamp == "1700000000");
}

TEST_CASE("readErrorFile accepts a numeric timestamp", "[agent][error_file]") {
  auto content = readText(R"({"message": {"message": "RuntimeError: x", "extraInfo": {"timestamp": 1700000001}}})");
  REQUIRE(content.has_value());
  CHECK(content->message == "RuntimeError: x");
  CHECK(content->timestamp == "1700000001");
  CHECK(content->traceback.empty());
}

TEST_CASE("readErrorFile reads a plain message", "[agent][error_file]") {
  auto content = readText(R"({"message": "plain"})");
  REQUIRE(content.has_value());
  CHECK(content->message == "plain");
  CHECK(content->traceback.empty());
}

TEST_CASE("readErrorFile skips members of every JSON type around torchrun's fields", "[agent][error_file]") {
  auto content = readText(
      R"( {"message": {"message": "m", "errorCode": null, "extraInfo": {"py_callstack": "tb", "timestamp": 1.7e9,)"
      R"( "other": [true, false, null, -0, 2e3, {"d": "x"}, {}, []]}}, "extra": {"a": 1.5}} )");
  REQUIRE(content.has_value());
  CHECK(content->message == "m");
  CHECK(content->traceback == "tb");
  CHECK(content->timestamp == "1700000000");
}

TEST_CASE("readErrorFile decodes every string escape, unicode and surrogate pairs", "[agent][error_file]") {
  // Decoded control characters other than newline and tab are shown as \xNN (the report goes to a
  // terminal); the rest arrives as UTF-8.
  CHECK(messageOf(R"({"message": "q\" b\\ s\/ \b\f\n\r\t \u00e9 \u20ac \ud83d\ude00 raw-é \u001b[31m"})") ==
        "q\" b\\ s/ \\x08\\x0c\n\\x0d\t \xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80 raw-\xC3\xA9 \\x1b[31m");
}

TEST_CASE("readErrorFile returns text that is not such JSON as it is", "[agent][error_file]") {
  CHECK(messageOf("  worker wrote this, not JSON\n") == "worker wrote this, not JSON");
  CHECK(messageOf(R"({"other": 1})") == R"({"other": 1})");
  CHECK(messageOf(R"(["message", "x"])") == R"(["message", "x"])");
  CHECK(messageOf(R"("message")") == R"("message")");
}

TEST_CASE("readErrorFile refuses invalid JSON instead of reading part of it", "[agent][error_file]") {
  // Each fragment is invalid; if the reader accepted it, the message would read "parsed".
  const char* bad[] = {
      "1,}",    "[1,]",      "[1 2]",      "{a:1}",      "'x'",        "\"unterminated}", "\"bad \\x escape\"",
      "\"\\u12\"", "\"\\ud83d\"", "\"\\ude00\"", "01",         "1.",         "-",               "1e",
      "tru",    "nul",       "+1",         "NaN",        "Infinity",   "/* c */ 1",       "\"tab\there\"",
      "{\"a\" 1}", "{\"a\":}", "1 // c\n",
  };
  for (const char* fragment : bad) {
    const std::string text = std::string(R"({"message": "parsed", "x": )") + fragment + "}";
    INFO(text);
    CHECK(messageOf(text) == text);
  }
  for (const std::string text : {R"({"message": "parsed"} {})", R"({"message": "parsed",})",
                                 R"({"message": "parsed"} x)", R"({"message": "parsed" "x": 1})"}) {
    INFO(text);
    CHECK(messageOf(text) == text);
  }
}

TEST_CASE("readErrorFile reads any cut-off prefix of a file as its raw text", "[agent][error_file]") {
  // A worker killed while writing leaves a truncated file: never a crash, never a partial read.
  for (std::size_t n = 1; n < kTorchrunFile.size(); ++n) {
    const std::string prefix = kTorchrunFile.substr(0, n);
    INFO(prefix);
    auto content = readText(prefix);
    const std::string expected(ddprun::trim(prefix));
    if (expected.empty()) {
      CHECK_FALSE(content.has_value());
      continue;
    }
    REQUIRE(content.has_value());
    CHECK(content->message == expected);
    CHECK(content->traceback.empty());
  }
}

TEST_CASE("readErrorFile bounds nesting, so a hostile file cannot exhaust memory or stack", "[agent][error_file]") {
  const std::string head = R"({"message": "parsed", "x": )";
  const std::size_t fits = ddprun::kMaxErrorFileDepth - 1;  // levels under the top object
  CHECK(messageOf(head + std::string(fits, '[') + std::string(fits, ']') + "}") == "parsed");
  const std::string tooDeep = head + std::string(fits + 1, '[') + std::string(fits + 1, ']') + "}";
  CHECK(messageOf(tooDeep) == tooDeep);

  const std::string deep = head + std::string(100000, '[') + std::string(100000, ']') + "}";
  const std::string message = messageOf(deep);
  CHECK(message.starts_with(head + "[[["));
  CHECK(message.ends_with("... (" + std::to_string(deep.size() - kMaxErrorMessageShown) + " more bytes)"));
}

TEST_CASE("readErrorFile reads at most 1 MiB of a huge file", "[agent][error_file]") {
  // A valid document larger than the bound is not read past the bound, so it is not JSON.
  const std::string huge = R"({"message": "big", "pad": ")" + std::string(2 * kMaxErrorFileBytes, 'x') + "\"}";
  const std::string message = messageOf(huge);
  CHECK(message.starts_with(R"({"message": "big", "pad": "xxxx)"));
  CHECK(message.size() < kMaxErrorMessageShown + 200);
  CHECK_THAT(message, Catch::Contains("(the file is larger than 1048576 bytes)"));

  // Just under the bound, it is read whole.
  const std::string fits = R"({"message": "fits", "pad": ")" + std::string(kMaxErrorFileBytes - 64, 'x') + "\"}";
  REQUIRE(fits.size() <= kMaxErrorFileBytes);
  CHECK(messageOf(fits) == "fits");
}

TEST_CASE("readErrorFile cuts a long message and traceback, saying by how much", "[agent][error_file]") {
  const std::string longMessage(100000, 'm');
  const std::string longTraceback(kMaxTracebackShown + 10, 't');
  auto content = readText(R"({"message": {"message": ")" + longMessage + R"(", "extraInfo": {"py_callstack": ")" +
                          longTraceback + "\"}}}");
  REQUIRE(content.has_value());
  CHECK(content->message == std::string(kMaxErrorMessageShown, 'm') + "... (" +
                                std::to_string(100000 - kMaxErrorMessageShown) + " more bytes)");
  CHECK(content->traceback == std::string(kMaxTracebackShown, 't') + "... (10 more bytes)");

  // A cut never splits a UTF-8 sequence: after "x", the bound falls inside a two-byte 'é'.
  std::string text = "x";
  while (text.size() < kMaxErrorMessageShown + 100) text += "\xC3\xA9";
  CHECK(messageOf(text) == text.substr(0, kMaxErrorMessageShown - 1) + "... (" +
                               std::to_string(text.size() - kMaxErrorMessageShown + 1) + " more bytes)");
}

TEST_CASE("readErrorFile shows binary content escaped, never raw control bytes", "[agent][error_file]") {
  const char bytes[] = "\x7f" "ELF\x02\x01\x01\x00\x00\x1b[2J\xff\xfe end";
  const std::string binary(bytes, sizeof(bytes) - 1);
  CHECK(messageOf(binary) == "\\x7fELF\\x02\\x01\\x01\\x00\\x00\\x1b[2J\xff\xfe end");
  // Bytes that are not UTF-8 inside a JSON string (Python's surrogateescape) are still a message.
  CHECK(messageOf("{\"message\": \"caf\xe9 \xff\"}") == "caf\xe9 \xff");
}

TEST_CASE("readErrorFile handles fields of the wrong type", "[agent][error_file]") {
  CHECK(messageOf(R"({"message": 42})") == "42");
  CHECK(messageOf(R"({"message": -7.5})") == "-7.5");
  for (const std::string text : {R"({"message": null})", R"({"message": true})", R"({"message": ["a"]})",
                                 R"({"message": ""})", R"({"message": {}})", R"({"message": {"message": ["a"]}})"}) {
    INFO(text);
    CHECK(messageOf(text) == text);
  }

  // A message object without a usable message keeps its traceback.
  auto content = readText(R"({"message": {"message": {"x": 1}, "extraInfo": {"py_callstack": "tb"}}})");
  REQUIRE(content.has_value());
  CHECK(content->message == R"({"message": {"message": {"x": 1}, "extraInfo": {"py_callstack": "tb"}}})");
  CHECK(content->traceback == "tb");

  content = readText(R"({"message": {"message": "m", "extraInfo": "not an object"}})");
  REQUIRE(content.has_value());
  CHECK(content->message == "m");
  CHECK(content->traceback.empty());
  CHECK(content->timestamp.empty());

  content = readText(R"({"message": {"message": "m", "extraInfo": {"py_callstack": 3, "timestamp": [1]}}})");
  REQUIRE(content.has_value());
  CHECK(content->traceback == "3");
  CHECK(content->timestamp.empty());

  // Numbers beyond a 64-bit integer are shown as numbers, not as an overflowed cast.
  auto timestampOf = [](const std::string& number) {
    auto c = readText(R"({"message": {"message": "m", "extraInfo": {"timestamp": )" + number + "}}}");
    return c ? c->timestamp : "(nullopt)";
  };
  CHECK(timestampOf("1e300") == "1e+300");
  CHECK(timestampOf("-1e300") == "-1e+300");
  CHECK(timestampOf("18446744073709551615") == "18446744073709551615");
  CHECK(timestampOf("-9223372036854775808") == "-9223372036854775808");
  CHECK(timestampOf("1700000000.25") == "1700000000.25");
}

TEST_CASE("readErrorFile gives nullopt for a missing or empty file", "[agent][error_file]") {
  TempDir dir;
  CHECK_FALSE(readErrorFile(dir.file("missing.json")).has_value());
  CHECK_FALSE(readErrorFile("").has_value());
  writeFile(dir.file("empty.json"), " \n");
  CHECK_FALSE(readErrorFile(dir.file("empty.json")).has_value());
  CHECK_FALSE(readErrorFile(dir.path()).has_value());  // a folder
}

TEST_CASE("readErrorFile reads only regular files: no endless device, no blocking FIFO", "[agent][error_file]") {
  CHECK_FALSE(readErrorFile("/dev/zero").has_value());

  TempDir dir;
  const std::string fifo = dir.file("error.json");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  auto result = std::async(std::launch::async, [&] { return readErrorFile(fifo); });
  const bool done = result.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  if (!done) {  // release a reader stuck in open(2), so that the test can fail instead of hanging
    int writer = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (writer >= 0) ::close(writer);
  }
  CHECK(done);
  CHECK_FALSE(result.get().has_value());
}
