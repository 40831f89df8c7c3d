// A Store in this process's memory, shared by threads: N ranks as N threads in tests, as gloo's
// HashStore. Thread-safe; waits block on a condition variable, each up to its timeout.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <unordered_map>

#include "worker_sdk/store.h"

namespace ddp {

struct InProcessStoreOptions {
  std::chrono::milliseconds timeout = Store::kDefaultTimeout;
};

class InProcessStore final : public Store {
 public:
  explicit InProcessStore(InProcessStoreOptions options = {});
  InProcessStore(const InProcessStore&) = delete;
  InProcessStore& operator=(const InProcessStore&) = delete;

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

 private:
  // Waits under `lock` until every key exists; TimeoutError naming the missing ones.
  void waitLocked(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                  std::chrono::milliseconds timeout);

  const InProcessStoreOptions options_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::unordered_map<std::string, std::string> values_;
};

}  // namespace ddp
