#include "agent/worker_output.h"

#include <fcntl.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <deque>

#include "agent/console_writer.h"
#include "agent/filtered_log.h"
#include "agent/line_splitter.h"
#include "common/error.h"
#include "common/unique_fd.h"

namespace ddprun {

class WorkerOutput::Stream : public std::enable_shared_from_this<Stream> {
 public:
  Stream(boost::asio::io_context& io, std::shared_ptr<ConsoleWriter> console, std::string prefix,
         const std::string& filePath, size_t tailLines, std::shared_ptr<FilteredLog> filtered)
      : console_(std::move(console)), filtered_(std::move(filtered)), prefix_(std::move(prefix)), tailLines_(tailLines),
        descriptor_(io) {
    Pipe pipe = makePipe();
    write_ = std::move(pipe.write);
    descriptor_.assign(pipe.read.release());
    descriptor_.non_blocking(true);
    if (!filePath.empty()) file_ = openFile(filePath);
  }

  int writeFd() const { return write_.get(); }
  void closeWriteEnd() { write_.reset(); }

  void start() { waitReadable(); }

  void drain() { readAvailable(SIZE_MAX); }

  void close() {
    if (!descriptor_.is_open()) return;
    drain();
    boost::system::error_code ignored;
    descriptor_.close(ignored);
    finish();
  }

  std::vector<std::string> tail() const { return {tail_.begin(), tail_.end()}; }
  // Where its lines go from now on (a spare that became a rank: the rank's prefix, console, file
  // and filter). Lines already read went where the spare's went.
  void retarget(std::shared_ptr<ConsoleWriter> console, std::string prefix, const std::string& filePath,
                std::shared_ptr<FilteredLog> filtered) {
    UniqueFd file;
    if (!filePath.empty()) file = openFile(filePath);
    console_ = std::move(console);
    prefix_ = std::move(prefix);
    filtered_ = std::move(filtered);
    file_ = std::move(file);
  }

 private:
  static UniqueFd openFile(const std::string& path) {
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!fd) throw DDPRUN_SYSTEM_ERROR("cannot open " + path);
    return fd;
  }

  void waitReadable() {
    if (!descriptor_.is_open()) return;
    descriptor_.async_wait(boost::asio::posix::descriptor_base::wait_read,
                           [self = shared_from_this()](const boost::system::error_code& ec) {
                             if (ec || !self->descriptor_.is_open()) return;
                             // Bounded per wake-up so one chatty worker cannot starve the others.
                             if (self->readAvailable(1 << 18)) self->waitReadable();
                           });
  }

  // Reads until the pipe is empty or `budget` bytes were read. Returns false at end-of-file.
  bool readAvailable(size_t budget) {
    if (!descriptor_.is_open() || eof_) return !eof_;
    char buf[65536];
    std::string console;
    bool open = true;
    size_t total = 0;
    while (total < budget) {
      ssize_t n = ::read(descriptor_.native_handle(), buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) break;  // EAGAIN: empty for now
      if (n == 0) {
        open = false;
        eof_ = true;
        break;
      }
      total += static_cast<size_t>(n);
      std::string_view chunk(buf, static_cast<size_t>(n));
      if (file_) writeAll(file_.get(), chunk);
      splitter_.feed(chunk, [&](std::string_view line) { emit(line, &console); });
    }
    if (!open) splitter_.finish([&](std::string_view line) { emit(line, &console); });
    flush(console);
    return open;
  }

  void finish() {
    std::string console;
    splitter_.finish([&](std::string_view line) { emit(line, &console); });
    flush(console);
  }

  void flush(const std::string& console) {
    if (!console.empty()) console_->write(console);
    if (!filtered_text_.empty()) {
      filtered_->write(filtered_text_);
      filtered_text_.clear();
    }
  }

  void emit(std::string_view line, std::string* console) {
    if (console_) {
      console->append(prefix_);
      console->append(line);
      console->push_back('\n');
    }
    if (filtered_ && filtered_->matches(line)) {
      filtered_text_.append(prefix_);
      filtered_text_.append(line);
      filtered_text_.push_back('\n');
    }
    if (tailLines_ > 0) {
      tail_.emplace_back(line.substr(0, 2048));
      if (tail_.size() > tailLines_) tail_.pop_front();
    }
  }

  std::shared_ptr<ConsoleWriter> console_;
  std::shared_ptr<FilteredLog> filtered_;
  std::string filtered_text_;  // matching lines of the current batch
  std::string prefix_;
  size_t tailLines_;
  boost::asio::posix::stream_descriptor descriptor_;
  UniqueFd write_;
  UniqueFd file_;
  LineSplitter splitter_;
  std::deque<std::string> tail_;
  bool eof_ = false;
};

WorkerOutput::WorkerOutput(boost::asio::io_context& io, const WorkerOutputOptions& options)
    : out_(std::make_shared<Stream>(io, options.stdoutConsole, options.prefix, options.stdoutFile, 0,
                                    options.stdoutFiltered)),
      err_(std::make_shared<Stream>(io, options.stderrConsole, options.prefix, options.stderrFile,
                                    options.tailLines, options.stderrFiltered)) {}

WorkerOutput::~WorkerOutput() { close(); }

int WorkerOutput::stdoutWriteFd() const { return out_->writeFd(); }
int WorkerOutput::stderrWriteFd() const { return err_->writeFd(); }

void WorkerOutput::closeWriteEnds() {
  out_->closeWriteEnd();
  err_->closeWriteEnd();
}

void WorkerOutput::start() {
  out_->start();
  err_->start();
}

void WorkerOutput::drain() {
  out_->drain();
  err_->drain();
}

void WorkerOutput::close() {
  out_->close();
  err_->close();
}

void WorkerOutput::becomeRank(const WorkerOutputOptions& options) {
  out_->retarget(options.stdoutConsole, options.prefix, options.stdoutFile, options.stdoutFiltered);
  err_->retarget(options.stderrConsole, options.prefix, options.stderrFile, options.stderrFiltered);
}

std::vector<std::string> WorkerOutput::stderrTail() const { return err_->tail(); }

}  // namespace ddprun
