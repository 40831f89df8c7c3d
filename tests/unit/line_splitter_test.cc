#include "agent/line_splitter.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

using ddprun::LineSplitter;

namespace {

// Feeds `chunks` one after the other, then finishes; returns every line emitted.
std::vector<std::string> splitAll(const std::vector<std::string>& chunks, size_t maxLineBytes = 1 << 20) {
  LineSplitter splitter(maxLineBytes);
  std::vector<std::string> lines;
  auto collect = [&](std::string_view line) { lines.emplace_back(line); };
  for (const auto& chunk : chunks) splitter.feed(chunk, collect);
  splitter.finish(collect);
  return lines;
}

std::vector<std::string> byteByByte(const std::string& text) {
  std::vector<std::string> chunks;
  for (char c : text) chunks.emplace_back(1, c);
  return chunks;
}

}  // namespace

TEST_CASE("a line split across chunks comes out whole", "[logs]") {
  CHECK(splitAll({"hel", "lo wo", "rld\n"}) == std::vector<std::string>{"hello world"});
  CHECK(splitAll(byteByByte("abc\ndef\n")) == std::vector<std::string>{"abc", "def"});
}

TEST_CASE("several lines in one chunk are emitted separately and in order", "[logs]") {
  CHECK(splitAll({"one\ntwo\nthree\n"}) == std::vector<std::string>{"one", "two", "three"});
  CHECK(splitAll({"a\nb", "c\nd\n"}) == std::vector<std::string>{"a", "bc", "d"});
}

TEST_CASE("empty lines are kept", "[logs]") {
  CHECK(splitAll({"\n\nx\n\n"}) == std::vector<std::string>{"", "", "x", ""});
  CHECK(splitAll({"\n", "\n"}) == std::vector<std::string>{"", ""});
}

TEST_CASE("nothing is emitted before the newline arrives", "[logs]") {
  LineSplitter splitter;
  std::vector<std::string> lines;
  auto collect = [&](std::string_view line) { lines.emplace_back(line); };
  splitter.feed("partial", collect);
  CHECK(lines.empty());
  splitter.feed(" line\n", collect);
  CHECK(lines == std::vector<std::string>{"partial line"});
}

TEST_CASE("finish emits the unfinished last line once", "[logs]") {
  LineSplitter splitter;
  std::vector<std::string> lines;
  auto collect = [&](std::string_view line) { lines.emplace_back(line); };
  splitter.feed("done\nno newline", collect);
  CHECK(lines == std::vector<std::string>{"done"});
  splitter.finish(collect);
  CHECK(lines == std::vector<std::string>{"done", "no newline"});
  splitter.finish(collect);  // nothing left
  CHECK(lines.size() == 2);
}

TEST_CASE("finish after a complete line emits nothing", "[logs]") {
  CHECK(splitAll({"x\n"}) == std::vector<std::string>{"x"});
  CHECK(splitAll({}).empty());
  CHECK(splitAll({""}).empty());
}

TEST_CASE("a long line without newline comes out in pieces of exactly maxLineBytes", "[logs]") {
  CHECK(splitAll({"abcdefghij"}, 4) == std::vector<std::string>{"abcd", "efgh", "ij"});
  CHECK(splitAll(byteByByte("abcdefghij"), 4) == std::vector<std::string>{"abcd", "efgh", "ij"});
  CHECK(splitAll({"abc", "defghij"}, 4) == std::vector<std::string>{"abcd", "efgh", "ij"});
}

TEST_CASE("a long line that ends in a newline comes out in pieces of exactly maxLineBytes", "[logs]") {
  // The whole line arrives in one chunk.
  CHECK(splitAll({"abcdefghij\n"}, 4) == std::vector<std::string>{"abcd", "efgh", "ij"});
  // Part of the line was buffered before the chunk that ends it.
  CHECK(splitAll({"abc", "defghij\n"}, 4) == std::vector<std::string>{"abcd", "efgh", "ij"});
}

TEST_CASE("a line of exactly maxLineBytes is one line, however it is chunked", "[logs]") {
  CHECK(splitAll({"abcd\nxy\n"}, 4) == std::vector<std::string>{"abcd", "xy"});
  CHECK(splitAll({"abcd", "\nxy\n"}, 4) == std::vector<std::string>{"abcd", "xy"});
  CHECK(splitAll(byteByByte("abcd\nxy\n"), 4) == std::vector<std::string>{"abcd", "xy"});
}

TEST_CASE("the lines do not depend on how the stream is chunked", "[logs]") {
  const std::string text = "short\n\nexactly8\na line that is much longer than eight\nabcdefgh\ntail";
  const auto whole = splitAll({text}, 8);
  CHECK(whole == splitAll(byteByByte(text), 8));
  std::vector<size_t> cutsThatDiffer;
  for (size_t cut = 1; cut < text.size(); ++cut) {
    if (splitAll({text.substr(0, cut), text.substr(cut)}, 8) != whole) cutsThatDiffer.push_back(cut);
  }
  CHECK(cutsThatDiffer.empty());
}
