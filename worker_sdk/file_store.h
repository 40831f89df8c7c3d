// The job's store on one machine (ddprun --standalone): a folder per round, given to the workers
// as DDPRUN_STORE_ADDR=file:///abs/path. Each key is a file whose name is the key in hex; set()
// writes a temporary file and renames it over the key's (atomic for readers); get() and wait()
// poll for the files with a short backoff (1 ms growing to 10 ms); add(), compareSet(), set()
// and deleteKey() hold an flock on the folder's lock file, so threads and processes agree.
// A restarted group gets a new, empty folder, so it never reads a value of the round before.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "worker_sdk/store.h"

namespace ddp {

struct FileStoreOptions {
  std::string path;  // the folder; created when missing
  std::chrono::milliseconds timeout = Store::kDefaultTimeout;  // get() and wait()
};

class FileStore final : public Store {
 public:
  // Keys may hold any bytes, at most kMaxKeyBytes of them (the file name is the key in hex).
  static constexpr std::size_t kMaxKeyBytes = 127;

  // Throws ddprun::ConfigError when the folder cannot be created or used.
  explicit FileStore(FileStoreOptions options);
  FileStore(const FileStore&) = delete;
  FileStore& operator=(const FileStore&) = delete;

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compareSet(const std::string& key, const std::string& expected,
                         const std::string& desired) override;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool deleteKey(const std::string& key) override;
  int64_t numKeys() override;
  std::chrono::milliseconds timeout() const override { return options_.timeout; }

  const std::string& path() const { return options_.path; }

 private:
  // The key's file; ConfigError for an empty or too long key.
  std::string keyPath(const std::string& key) const;
  // Writes value to the key's file atomically (temporary file + rename). Caller holds the lock.
  void writeKey(const std::string& key, const std::string& value);

  const FileStoreOptions options_;
  std::atomic<uint64_t> tempCounter_{0};  // names this store's temporary files
};

}  // namespace ddp
