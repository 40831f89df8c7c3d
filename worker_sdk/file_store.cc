#include "worker_sdk/file_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <limits>
#include <optional>
#include <thread>

#include "common/error.h"
#include "common/strings.h"

namespace ddp {

namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

constexpr char kKeyFilePrefix = 'k';        // key files: 'k' + hex(key)
constexpr const char* kLockFile = ".lock";  // never starts with 'k'
constexpr const char* kTempPrefix = ".tmp.";
constexpr milliseconds kFirstBackoff{1};
constexpr milliseconds kMaxBackoff{10};
constexpr milliseconds kLongestWait = std::chrono::hours(24 * 365);

std::string toHex(const std::string& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out += kDigits[c >> 4];
    out += kDigits[c & 0xf];
  }
  return out;
}

std::string quoted(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& key : keys) out += (out.empty() ? "'" : ", '") + key + "'";
  return out;
}

// Closes the descriptor on every path out.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// The file's contents; nullopt when it does not exist.
std::optional<std::string> readFile(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == ENOENT) return std::nullopt;
    throw DDPRUN_SYSTEM_ERROR("open " + path);
  }
  std::string out;
  char buf[8192];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw DDPRUN_SYSTEM_ERROR("read " + path);
    }
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  return out;
}

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// Holds an exclusive flock on the folder's lock file. Each holder opens its own descriptor, so
// threads of one process exclude each other as processes do.
class FolderLock {
 public:
  explicit FolderLock(const std::string& dir) : fd_(::open((dir + "/" + kLockFile).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600)) {
    if (fd_.get() < 0) throw DDPRUN_SYSTEM_ERROR("open the lock file in " + dir);
    while (::flock(fd_.get(), LOCK_EX) != 0) {
      if (errno != EINTR) throw DDPRUN_SYSTEM_ERROR("flock the lock file in " + dir);
    }
  }  // the lock goes with the descriptor

 private:
  Fd fd_;
};

}  // namespace

FileStore::FileStore(FileStoreOptions options) : options_(std::move(options)) {
  if (options_.path.empty()) throw ddprun::ConfigError("the file store needs a folder");
  std::error_code ec;
  fs::create_directories(options_.path, ec);
  if (ec || !fs::is_directory(options_.path, ec)) {
    throw ddprun::ConfigError("the file store's folder '" + options_.path + "' cannot be used" +
                              (ec ? ": " + ec.message() : std::string()));
  }
}

std::string FileStore::keyPath(const std::string& key) const {
  if (key.empty()) throw ddprun::ConfigError("store key must not be empty");
  if (key.size() > kMaxKeyBytes) {
    throw ddprun::ConfigError("store key of " + std::to_string(key.size()) + " bytes is longer than the file store's " +
                              std::to_string(kMaxKeyBytes));
  }
  return options_.path + "/" + kKeyFilePrefix + toHex(key);
}

void FileStore::writeKey(const std::string& key, const std::string& value) {
  const std::string target = keyPath(key);
  const std::string temp = options_.path + "/" + kTempPrefix + std::to_string(::getpid()) + "." +
                           std::to_string(reinterpret_cast<std::uintptr_t>(this)) + "." +
                           std::to_string(tempCounter_.fetch_add(1));
  {
    Fd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (fd.get() < 0) throw DDPRUN_SYSTEM_ERROR("create " + temp);
    std::size_t done = 0;
    while (done < value.size()) {
      const ssize_t n = ::write(fd.get(), value.data() + done, value.size() - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        const int saved = errno;
        ::unlink(temp.c_str());
        errno = saved;
        throw DDPRUN_SYSTEM_ERROR("write " + temp);
      }
      done += static_cast<std::size_t>(n);
    }
  }
  if (::rename(temp.c_str(), target.c_str()) != 0) {
    const int saved = errno;
    ::unlink(temp.c_str());
    errno = saved;
    throw DDPRUN_SYSTEM_ERROR("rename " + temp + " to " + target);
  }
}

void FileStore::set(const std::string& key, const std::string& value) {
  keyPath(key);  // validates before taking the lock
  FolderLock lock(options_.path);
  writeKey(key, value);
}

std::string FileStore::get(const std::string& key) {
  const std::string path = keyPath(key);
  for (;;) {
    wait({key}, options_.timeout);
    // A deleteKey() between the wait and the read sends us back to waiting.
    if (auto value = readFile(path)) return *value;
  }
}

int64_t FileStore::add(const std::string& key, int64_t delta) {
  const std::string path = keyPath(key);
  FolderLock lock(options_.path);
  int64_t current = 0;
  if (auto value = readFile(path)) {
    auto parsed = ddprun::parseInt(*value);
    if (!parsed) throw ddprun::StateError("store key '" + key + "' does not hold a number");
    current = *parsed;
  }
  if ((delta > 0 && current > std::numeric_limits<int64_t>::max() - delta) ||
      (delta < 0 && current < std::numeric_limits<int64_t>::min() - delta)) {
    throw ddprun::StateError("store counter '" + key + "' would overflow");
  }
  const int64_t result = current + delta;
  writeKey(key, std::to_string(result));
  return result;
}

std::string FileStore::compareSet(const std::string& key, const std::string& expected, const std::string& desired) {
  const std::string path = keyPath(key);
  FolderLock lock(options_.path);
  auto current = readFile(path);
  if (!current) {
    if (!expected.empty()) return {};
  } else if (*current != expected) {
    return *current;
  }
  writeKey(key, desired);
  return desired;
}

void FileStore::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  std::vector<std::string> paths;
  for (const auto& key : keys) paths.push_back(keyPath(key));
  const auto bounded = std::clamp(timeout, milliseconds(0), kLongestWait);
  const auto deadline = std::chrono::steady_clock::now() + bounded;
  auto backoff = kFirstBackoff;
  for (;;) {
    std::vector<std::string> missing;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (!exists(paths[i])) missing.push_back(keys[i]);
    }
    if (missing.empty()) return;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      throw ddprun::TimeoutError("timed out after " + std::to_string(timeout.count()) +
                                 " ms waiting for store key(s) " + quoted(missing) + " in " + options_.path);
    }
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
}

bool FileStore::check(const std::vector<std::string>& keys) {
  std::vector<std::string> paths;
  for (const auto& key : keys) paths.push_back(keyPath(key));
  return std::all_of(paths.begin(), paths.end(), [](const std::string& p) { return exists(p); });
}

bool FileStore::deleteKey(const std::string& key) {
  const std::string path = keyPath(key);
  FolderLock lock(options_.path);
  if (::unlink(path.c_str()) == 0) return true;
  if (errno == ENOENT) return false;
  throw DDPRUN_SYSTEM_ERROR("unlink " + path);
}

int64_t FileStore::numKeys() {
  int64_t count = 0;
  std::error_code ec;
  for (fs::directory_iterator it(options_.path, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.empty() && name[0] == kKeyFilePrefix) ++count;
  }
  if (ec) throw ddprun::Error("cannot list the file store's folder '" + options_.path + "': " + ec.message());
  return count;
}

}  // namespace ddp
