#include "agent/error_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/json/monotonic_resource.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>
#include <cerrno>
#include <chrono>
#include <charconv>
#include <cmath>
#include <exception>
#include <string_view>

#include "common/strings.h"
#include "common/unique_fd.h"

namespace ddprun {
namespace {

struct BoundedText {
  std::string text;
  bool cut = false;  // the file holds more than `limit` bytes
};

// At most `limit` bytes of a regular file; nullopt when it is absent, not a regular file (a FIFO
// would block, a device could be endless) or cannot be read. Does not trust st_size: the worker
// may still be writing.
std::optional<BoundedText> readBounded(const std::string& path, std::size_t limit) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (!fd) return std::nullopt;
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  BoundedText out;
  char chunk[64 * 1024];
  while (out.text.size() <= limit) {  // one byte more than the limit tells a larger file
    const std::size_t want = std::min(sizeof(chunk), limit + 1 - out.text.size());
    const ssize_t n = ::read(fd.get(), chunk, want);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return std::nullopt;
    if (n == 0) break;
    out.text.append(chunk, static_cast<std::size_t>(n));
  }
  if (out.text.size() > limit) {
    out.cut = true;
    out.text.resize(limit);
  }
  return out;
}

// The first `limit` bytes (not splitting a UTF-8 sequence), saying how much was left out.
std::string cut(std::string_view text, std::size_t limit) {
  if (text.size() <= limit) return std::string(text);
  std::size_t end = limit;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  return std::string(text.substr(0, end)) + "... (" + std::to_string(text.size() - end) + " more bytes)";
}

// Control characters other than newline and tab as \xNN: the report goes to a terminal.
std::string printable(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if ((u < 0x20 && c != '\n' && c != '\t') || u == 0x7F) {
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 0xF];
    } else {
      out += c;
    }
  }
  return out;
}

std::string shown(std::string_view text, std::size_t limit) { return printable(cut(text, limit)); }

std::string numberText(double d) {
  // torchrun writes timestamps as integers; any other number is shown as the shortest decimal.
  if (std::isfinite(d) && d == std::trunc(d) && std::fabs(d) < 9.0e18) {
    return std::to_string(static_cast<long long>(d));
  }
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), d);
  return ec == std::errc() ? std::string(buf, end) : std::string();
}

// A string member as it is, a number as text (torchrun writes timestamps either way); empty for
// anything else (object, array, bool, null) or a missing member.
std::string field(const boost::json::object* object, std::string_view name) {
  const boost::json::value* v = object ? object->if_contains(name) : nullptr;
  if (!v) return {};
  if (const auto* s = v->if_string()) return std::string(s->data(), s->size());
  if (const auto* i = v->if_int64()) return std::to_string(*i);
  if (const auto* u = v->if_uint64()) return std::to_string(*u);
  if (const auto* d = v->if_double()) return numberText(*d);
  return {};
}

// The fields of torchrun's JSON in text, uncut; an empty message when text is not such JSON.
ErrorFileContent parseTorchrunJson(std::string_view text) {
  // The document is at most kMaxErrorFileBytes, so its tree is bounded too; one monotonic arena,
  // released at once, starting on the stack.
  unsigned char initial[4096];
  boost::json::monotonic_resource arena(initial, sizeof(initial));
  boost::json::parse_options options;
  options.max_depth = kMaxErrorFileDepth;
  options.allow_invalid_utf8 = true;  // bytes from a surrogate-escaped path are still a message
  boost::system::error_code ec;
  const boost::json::value root = boost::json::parse(text, ec, &arena, options);
  const boost::json::object* top = ec ? nullptr : root.if_object();
  if (!top) return {};

  ErrorFileContent content;
  const boost::json::value* message = top->if_contains("message");
  if (const boost::json::object* nested = message ? message->if_object() : nullptr) {
    content.message = field(nested, "message");
    const boost::json::value* extra = nested->if_contains("extraInfo");
    const boost::json::object* extraObject = extra ? extra->if_object() : nullptr;
    content.traceback = field(extraObject, "py_callstack");
    content.timestamp = field(extraObject, "timestamp");
  } else {
    content.message = field(top, "message");
  }
  return content;
}

}  // namespace

std::optional<ErrorFileContent> readErrorFile(const std::string& path) {
  if (path.empty()) return std::nullopt;
  try {
    auto file = readBounded(path, kMaxErrorFileBytes);
    if (!file || trim(file->text).empty()) return std::nullopt;

    const ErrorFileContent parsed = parseTorchrunJson(file->text);
    ErrorFileContent content;
    if (parsed.message.empty()) {  // not torchrun's JSON, or no message in it: the text as it is
      content.message = shown(trim(file->text), kMaxErrorMessageShown);
      if (file->cut) content.message += " (the file is larger than " + std::to_string(kMaxErrorFileBytes) + " bytes)";
    } else {
      content.message = shown(parsed.message, kMaxErrorMessageShown);
    }
    content.traceback = shown(parsed.traceback, kMaxTracebackShown);
    content.timestamp = shown(parsed.timestamp, 64);
    return content;
  } catch (const std::exception& e) {  // out of memory: the report must still be written
    return ErrorFileContent{"(cannot read the error file: " + std::string(e.what()) + ")", {}, {}};
  }
}

bool writeErrorFile(const std::string& path, const std::string& message, const std::string& traceback) {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  boost::json::object extra{{"py_callstack", traceback},
                            {"timestamp", std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now).count())}};
  boost::json::object inner{{"message", message}, {"extraInfo", std::move(extra)}};
  const std::string text = boost::json::serialize(boost::json::object{{"message", std::move(inner)}});
  const std::string tmp = path + ".ddprun.tmp";
  {
    UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644));
    if (!fd) return false;
    std::size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::write(fd.get(), text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      done += static_cast<std::size_t>(n);
    }
  }
  return ::rename(tmp.c_str(), path.c_str()) == 0;
}

}  // namespace ddprun
