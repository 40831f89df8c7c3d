#include "agent/console_writer.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "common/error.h"

namespace ddprun {

struct ConsoleWriter::State {
  ConsoleWriterOptions options;
  int fd = -1;  // a duplicate of options.fd, owned by the writing thread: closing the original (and
                // reusing its number) can never redirect a write that is still under way
  std::mutex mu;
  std::condition_variable wake;     // the thread: something to write, or stop
  std::condition_variable written;  // flush(): the queue emptied
  std::string queue;
  bool writing = false;   // the thread holds a batch it has not finished writing
  bool stop = false;
  bool failed = false;    // the console is gone (EPIPE, EBADF...): drop everything, silently
  uint64_t dropped = 0;   // lines dropped in all
  uint64_t unreported = 0;  // dropped lines not yet announced by a marker

  void run() {
    // A console that closed must give EPIPE here, not kill the process: SIGPIPE from write() goes
    // to the writing thread, which keeps it blocked (and pending, harmlessly).
    sigset_t pipeSignal;
    sigemptyset(&pipeSignal);
    sigaddset(&pipeSignal, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipeSignal, nullptr);
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      wake.wait(lock, [&] { return stop || !queue.empty(); });
      if (queue.empty()) {  // stopping, and nothing left
        ::close(fd);
        return;
      }
      std::string batch;
      batch.swap(queue);
      writing = true;
      lock.unlock();
      bool ok = writeAll(batch);
      lock.lock();
      writing = false;
      if (!ok) {
        failed = true;  // nothing will ever be written again: forget what waits, wake flush()
        queue.clear();
      }
      if (queue.empty()) written.notify_all();
    }
  }

  bool writeAll(const std::string& data) {
    std::size_t done = 0;
    while (done < data.size()) {
      ssize_t n = ::write(fd, data.data() + done, data.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      done += static_cast<std::size_t>(n);
    }
    return true;
  }
};

ConsoleWriter::ConsoleWriter(ConsoleWriterOptions options) : state_(std::make_shared<State>()) {
  state_->options = options;
  state_->fd = ::fcntl(options.fd, F_DUPFD_CLOEXEC, 3);
  if (state_->fd < 0) throw DDPRUN_SYSTEM_ERROR("cannot duplicate console fd " + std::to_string(options.fd));
  std::thread([state = state_] { state->run(); }).detach();
}

ConsoleWriter::~ConsoleWriter() {
  flush(std::chrono::seconds(1));
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->stop = true;
  state_->wake.notify_all();
  // The thread owns a reference to the state: it ends when the queue is written, or stays blocked
  // in write() on a console that never reads until the process exits, touching nothing else.
}

void ConsoleWriter::write(std::string_view lines) {
  if (lines.empty()) return;
  std::lock_guard<std::mutex> lock(state_->mu);
  State& s = *state_;
  if (s.failed) return;
  std::string marker;
  if (s.unreported > 0) marker = "[ddprun: " + std::to_string(s.unreported) + " lines dropped]\n";
  if (s.queue.size() + marker.size() + lines.size() > s.options.maxBufferedBytes) {
    const auto count = static_cast<uint64_t>(std::count(lines.begin(), lines.end(), '\n'));
    s.dropped += std::max<uint64_t>(count, 1);
    s.unreported += std::max<uint64_t>(count, 1);
    return;
  }
  s.queue += marker;
  s.unreported = 0;
  s.queue.append(lines);
  s.wake.notify_one();
}

bool ConsoleWriter::flush(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(state_->mu);
  State& s = *state_;
  if (s.unreported > 0 && !s.failed) {
    // The marker goes out even when no line follows it (it is small: the bound may be passed).
    s.queue += "[ddprun: " + std::to_string(s.unreported) + " lines dropped]\n";
    s.unreported = 0;
    s.wake.notify_one();
  }
  return s.written.wait_for(lock, timeout, [&] { return s.failed || (s.queue.empty() && !s.writing); });
}

uint64_t ConsoleWriter::droppedLines() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->dropped;
}

}  // namespace ddprun
