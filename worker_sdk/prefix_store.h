// A view of another Store under a key prefix, as gloo's PrefixStore and c10d's PrefixStore: lets
// several communicators bootstrap through one store without their keys meeting.
#pragma once

#include <string>

#include "worker_sdk/store.h"

namespace ddp {

class PrefixStore final : public Store {
 public:
  // `base` must outlive this view. numKeys() counts the base store's keys, as c10d's does.
  PrefixStore(std::string prefix, Store& base);

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
  std::chrono::milliseconds timeout() const override;

  const std::string& prefix() const { return prefix_; }

 private:
  // prefix + key; ConfigError for an empty key, which the base store would not see as empty.
  std::string join(const std::string& key) const;
  std::vector<std::string> join(const std::vector<std::string>& keys) const;

  const std::string prefix_;
  Store& base_;
};

}  // namespace ddp
