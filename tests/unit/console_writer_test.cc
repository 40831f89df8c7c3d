// ConsoleWriter on a real pipe (a file descriptor is its whole interface): a reader that never
// reads must not block the writer; drops are counted and announced; nothing is lost or
// interleaved while the reader keeps up.
#include "agent/console_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <thread>

using ddprun::ConsoleWriter;
using ddprun::ConsoleWriterOptions;
using namespace std::chrono_literals;

namespace {

struct Pipe {
  int r = -1, w = -1;
  Pipe() {
    int fds[2];
    REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
    r = fds[0];
    w = fds[1];
  }
  ~Pipe() {
    if (r >= 0) ::close(r);
    if (w >= 0) ::close(w);
  }
  // Reads until `n` bytes or end-of-file.
  std::string readAll() {
    std::string out;
    char buf[65536];
    ssize_t got;
    while ((got = ::read(r, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(got));
    return out;
  }
};

std::string lines(int count, char c) {
  std::string out;
  for (int i = 0; i < count; ++i) out += std::string(99, c) + "\n";
  return out;
}

}  // namespace

TEST_CASE("console: a reader that never reads does not block the writer, drops are counted", "[console]") {
  Pipe p;
  // A pipe holds 64 KiB, the writing thread one batch (<= 64 KiB) and the queue 64 KiB: the rest
  // of 10 MB must be dropped, at once.
  auto writer = std::make_unique<ConsoleWriter>(ConsoleWriterOptions{p.w, 64 * 1024});
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 1000; ++i) writer->write(lines(100, 'a'));  // 100,000 lines, 10 MB
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK(took < 10s);  // a safety bound: blocking would be forever
  CHECK(writer->droppedLines() >= 100000 - 3 * 64 * 1024 / 100);
  CHECK(writer->droppedLines() % 100 == 0);  // whole batches
  // Give up on the console: the destructor returns though the pipe never drains.
  const auto before = std::chrono::steady_clock::now();
  CHECK_FALSE(writer->flush(200ms));
  writer.reset();
  CHECK(std::chrono::steady_clock::now() - before < 10s);
}

TEST_CASE("console: once the reader catches up, a marker says how many lines were dropped", "[console]") {
  Pipe p;
  auto writer = std::make_unique<ConsoleWriter>(ConsoleWriterOptions{p.w, 1000});
  writer->write(lines(5, 'a'));   // 500 bytes: queued
  writer->write(lines(6, 'b'));   // 600 more: over 1000 unless the first was written already
  REQUIRE(writer->flush(10s));
  writer->write(lines(20, 'c'));  // 2000 bytes: never fits, dropped
  const uint64_t dropped = writer->droppedLines();
  writer->write(lines(1, 'd'));   // fits: preceded by the marker
  REQUIRE(writer->flush(10s));
  writer.reset();  // its thread closes its copy of the pipe once idle
  ::close(p.w);
  p.w = -1;
  std::string text = p.readAll();
  CHECK(dropped >= 20);
  CHECK(text.find("[ddprun: 20 lines dropped]\n" + lines(1, 'd')) != std::string::npos);
  CHECK(text.find('c') == std::string::npos);
}

TEST_CASE("console: with a reader, every line arrives, each batch whole", "[console]") {
  Pipe p;
  std::string received;
  std::thread reader([&] { received = p.readAll(); });
  {
    ConsoleWriter writer(ConsoleWriterOptions{p.w, 1 << 20});
    std::thread other([&] {
      for (int i = 0; i < 200; ++i) writer.write(lines(10, 'y'));
    });
    for (int i = 0; i < 200; ++i) writer.write(lines(10, 'x'));
    other.join();
    REQUIRE(writer.flush(10s));
    CHECK(writer.droppedLines() == 0);
  }
  ::close(p.w);
  p.w = -1;
  reader.join();
  CHECK(received.size() == 2 * 200 * 10 * 100);
  // Batches never interleave: every run of x's or y's is a multiple of a 10-line batch.
  size_t runStart = 0;
  for (size_t i = 1; i <= received.size(); ++i) {
    if (i == received.size() || received[i] != received[runStart] && received[i] != '\n' && received[i - 1] == '\n') {
      CHECK((i - runStart) % 1000 == 0);
      runStart = i;
    }
  }
}
