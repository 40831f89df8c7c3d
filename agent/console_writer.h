// The console (ddprun's stdout or stderr) as a writer that never blocks its caller. Lines are queued
// in a bounded buffer and written by a thread of its own, so a console nobody reads (a stopped
// pager, a full pipe to a dead consumer) cannot stall supervision. When the buffer is full, whole
// batches of lines are dropped and counted; the next line that fits is preceded by
// "[ddprun: N lines dropped]". Log files are written elsewhere and lose nothing.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

namespace ddprun {

struct ConsoleWriterOptions {
  int fd = 1;  // duplicated (the writer owns its copy); never switched to non-blocking
  std::size_t maxBufferedBytes = 4 << 20;       // queued and not yet written
};

class ConsoleWriter {
 public:
  explicit ConsoleWriter(ConsoleWriterOptions options);
  // Waits up to 1 s for the queue to drain, then leaves the writing thread behind (detached, with
  // its own state) if the console still does not take it.
  ~ConsoleWriter();
  ConsoleWriter(const ConsoleWriter&) = delete;
  ConsoleWriter& operator=(const ConsoleWriter&) = delete;

  // Queues `lines` (whole lines, each ending in '\n') as one unit, never interleaved with another
  // call's; never blocks. Dropped, and counted by its newlines, when the buffer has no room.
  void write(std::string_view lines);
  // Waits up to `timeout` until everything queued (and the drop marker, if due) is written.
  bool flush(std::chrono::milliseconds timeout);
  // Lines dropped so far.
  uint64_t droppedLines() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace ddprun
