// Error types shared by every ddprun library. Recoverable errors are exceptions of these types;
// expected outcomes (a worker's exit, a finished job) are values, never exceptions.
#pragma once

#include <stdexcept>
#include <string>

namespace ddprun {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad user input: a flag, a value, a program that cannot run. The CLI exits 2 on these.
class ConfigError : public Error {
 public:
  using Error::Error;
};

class TimeoutError : public Error {
 public:
  using Error::Error;
};

class ClosedError : public Error {
 public:
  using Error::Error;
};

class ConnectionError : public Error {
 public:
  using Error::Error;
};

class StateError : public Error {
 public:
  using Error::Error;
};

// A limit on a shared resource is reached (the store's bytes or keys): RESOURCE_EXHAUSTED.
class CapacityError : public Error {
 public:
  using Error::Error;
};

// An OS call failed: carries errno and where it was called, wrapped once at the edge.
class SystemError : public Error {
 public:
  SystemError(const std::string& what, int err, const char* file, int line);
  int code() const { return code_; }

 private:
  int code_;
};

namespace detail {
[[noreturn]] void checkFailed(const char* expr, const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace ddprun

// Invariant check: a false condition is a bug in ddprun, not bad input.
#define DDPRUN_CHECK(cond, msg)                                              \
  do {                                                                       \
    if (!(cond)) ::ddprun::detail::checkFailed(#cond, __FILE__, __LINE__, (msg)); \
  } while (0)

// Wraps a failed OS call (errno already set) with its call site.
#define DDPRUN_SYSTEM_ERROR(what) ::ddprun::SystemError((what), errno, __FILE__, __LINE__)
