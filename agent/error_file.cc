#include "agent/error_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>
#include <cerrno>
#include <string_view>

#include "common/strings.h"
#include "common/unique_fd.h"

namespace ddprun {
namespace {

// At most `limit` bytes of a regular file; nullopt when it is not one or cannot be read.
std::optional<std::string> readBounded(const std::string& path, std::size_t limit, std::size_t* fullSize) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (!fd) return std::nullopt;
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  *fullSize = static_cast<std::size_t>(st.st_size);
  std::string text(std::min(limit, *fullSize), '\0');
  std::size_t got = 0;
  while (got < text.size()) {
    ssize_t n = ::read(fd.get(), text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  text.resize(got);
  return text;
}

std::string cut(std::string text, std::size_t limit) {
  if (text.size() <= limit) return text;
  const std::size_t more = text.size() - limit;
  text.resize(limit);
  return text + "... (+" + std::to_string(more) + " bytes)";
}

// A string member as it is, a number as an integer (torchrun writes timestamps either way).
std::string field(const boost::json::object* object, std::string_view name) {
  if (!object) return {};
  const boost::json::value* v = object->if_contains(name);
  if (!v) return {};
  if (const auto* s = v->if_string()) return std::string(s->data(), s->size());
  if (const auto* i = v->if_int64()) return std::to_string(*i);
  if (const auto* u = v->if_uint64()) return std::to_string(*u);
  if (const auto* d = v->if_double()) return std::to_string(static_cast<long long>(*d));
  return {};
}

}  // namespace

std::optional<ErrorFileContent> readErrorFile(const std::string& path) {
  if (path.empty()) return std::nullopt;
  std::size_t fullSize = 0;
  auto text = readBounded(path, kMaxErrorFileBytes, &fullSize);
  if (!text || trim(*text).empty()) return std::nullopt;

  ErrorFileContent content;
  const std::string raw = cut(std::string(trim(*text)), kMaxErrorMessageShown) +
                          (fullSize > text->size() ? " (file of " + std::to_string(fullSize) + " bytes)" : "");
  boost::json::parse_options options;
  options.max_depth = kMaxErrorFileDepth;
  boost::system::error_code ec;
  boost::json::value root = boost::json::parse(*text, ec, {}, options);
  const boost::json::object* top = ec ? nullptr : root.if_object();
  if (!top) {
    content.message = raw;
    return content;
  }
  const boost::json::value* message = top->if_contains("message");
  if (const boost::json::object* nested = message ? message->if_object() : nullptr) {
    content.message = field(nested, "message");
    const boost::json::value* extra = nested->if_contains("extraInfo");
    const boost::json::object* extraObject = extra ? extra->if_object() : nullptr;
    content.traceback = cut(field(extraObject, "py_callstack"), kMaxTracebackShown);
    content.timestamp = cut(field(extraObject, "timestamp"), 64);
  } else {
    content.message = field(top, "message");
  }
  content.message = content.message.empty() ? raw : cut(content.message, kMaxErrorMessageShown);
  return content;
}

}  // namespace ddprun
