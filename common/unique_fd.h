// Owning file descriptor, closed on destruction.
#pragma once

#include <string_view>
#include <utility>

namespace ddprun {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

struct Pipe {
  UniqueFd read;
  UniqueFd write;
};

// A pipe whose both ends are close-on-exec. Throws SystemError.
Pipe makePipe();

// Writes all of data, retrying on EINTR and waiting out EAGAIN. Returns false when the reader is
// gone (EPIPE) or the fd is broken; output is best effort, never an exception.
bool writeAll(int fd, std::string_view data);

}  // namespace ddprun
