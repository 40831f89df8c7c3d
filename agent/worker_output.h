// One worker's stdout and stderr: pipes read on the event loop, cut into whole lines, prefixed and
// written to the console (one write per batch of whole lines, so lines of different workers never
// mix), copied raw to per-rank files, and the last stderr lines kept for the failure summary.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace boost::asio {
class io_context;
}

namespace ddprun {

class ConsoleWriter;
class FilteredLog;

struct WorkerOutputOptions {
  std::string prefix;            // put before every console line
  // Where console lines go (ddprun's stdout and stderr); null: this stream is not shown.
  std::shared_ptr<ConsoleWriter> stdoutConsole;
  std::shared_ptr<ConsoleWriter> stderrConsole;
  std::string stdoutFile;        // empty = no file
  std::string stderrFile;
  // stderr lines remembered for the failure summary (its last lines, and the stack a hung rank
  // dumps: agent/stack_dump.h), each cut to 2 KB.
  size_t tailLines = 400;
  // --duplicate_*_filters: matching prefixed lines also go there (shared by the ranks); null: none.
  std::shared_ptr<FilteredLog> stdoutFiltered;
  std::shared_ptr<FilteredLog> stderrFiltered;
};

class WorkerOutput {
 public:
  // Creates the pipes and opens the files. Throws SystemError.
  WorkerOutput(boost::asio::io_context& io, const WorkerOutputOptions& options);
  ~WorkerOutput();

  // Write ends to hand to the child; call closeWriteEnds() once it is spawned.
  int stdoutWriteFd() const;
  int stderrWriteFd() const;
  void closeWriteEnds();

  // Starts reading on the event loop.
  void start();
  // Reads everything that is in the pipes right now (the worker has exited, its last words are
  // there). Grandchildren may still hold the pipes, so this does not wait for end-of-file.
  void drain();
  // Stops reading and emits unfinished last lines.
  void close();

  std::vector<std::string> stderrTail() const;
  // A warm spare became a rank: its lines go where the rank's go from now on (`options`' prefix,
  // consoles, files and filters; not its tail length). Throws SystemError when a file cannot be
  // opened; the lines then go on as before.
  void becomeRank(const WorkerOutputOptions& options);

 private:
  class Stream;
  std::shared_ptr<Stream> out_;
  std::shared_ptr<Stream> err_;
};

}  // namespace ddprun
