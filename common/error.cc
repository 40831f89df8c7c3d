#include "common/error.h"

#include <cstring>

namespace ddprun {

static std::string baseName(const char* file) {
  const char* slash = std::strrchr(file, '/');
  return slash ? slash + 1 : file;
}

SystemError::SystemError(const std::string& what, int err, const char* file, int line)
    : Error(what + ": " + std::strerror(err) + " (" + baseName(file) + ":" + std::to_string(line) + ")"),
      code_(err) {}

namespace detail {
void checkFailed(const char* expr, const char* file, int line, const std::string& msg) {
  throw StateError("internal check failed: " + std::string(expr) + " (" + baseName(file) + ":" +
                   std::to_string(line) + "): " + msg);
}
}  // namespace detail

}  // namespace ddprun
