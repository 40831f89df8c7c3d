#include "common/token_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "common/strings.h"
#include "common/unique_fd.h"

namespace ddprun {

std::string readTokenFile(const std::string& path, std::string_view what) {
  const std::string named = std::string(what) + " '" + printable(path, 256) + "'";
  // O_NONBLOCK: opening a FIFO nobody writes must not hang; fstat then refuses it.
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (!fd) throw ConfigError(named + " cannot be read: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) throw ConfigError(named + " is not a regular file");
  if (static_cast<std::size_t>(st.st_size) > kMaxTokenFileBytes) {
    throw ConfigError(named + " is " + std::to_string(st.st_size) + " bytes; a token file holds at most " +
                      std::to_string(kMaxTokenFileBytes));
  }
  std::string content(kMaxTokenFileBytes + 1, '\0');
  std::size_t got = 0;
  while (got < content.size()) {
    ssize_t n = ::read(fd.get(), content.data() + got, content.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw ConfigError(named + " cannot be read: " + std::strerror(errno));
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  if (got > kMaxTokenFileBytes) throw ConfigError(named + " grew past " + std::to_string(kMaxTokenFileBytes) + " bytes");
  content.resize(got);
  std::string token(trim(std::string_view(content).substr(0, content.find('\n'))));
  if (token.empty()) throw ConfigError(named + " holds no token (its first line is empty)");
  return token;
}

}  // namespace ddprun
