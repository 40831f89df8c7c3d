#include "worker_sdk/in_process_store.h"

#include <algorithm>
#include <limits>

#include "common/error.h"
#include "common/strings.h"

namespace ddp {

namespace {

void validateKey(const std::string& key) {
  if (key.empty()) throw ddprun::ConfigError("store key must not be empty");
}

constexpr std::chrono::milliseconds kLongestWait = std::chrono::hours(24 * 365);

std::string quoted(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& key : keys) out += (out.empty() ? "'" : ", '") + key + "'";
  return out;
}

}  // namespace

InProcessStore::InProcessStore(InProcessStoreOptions options) : options_(options) {}

void InProcessStore::set(const std::string& key, const std::string& value) {
  validateKey(key);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    values_[key] = value;
  }
  changed_.notify_all();
}

std::string InProcessStore::get(const std::string& key) {
  validateKey(key);
  std::unique_lock<std::mutex> lock(mutex_);
  waitLocked(lock, {key}, options_.timeout);
  return values_.at(key);
}

int64_t InProcessStore::add(const std::string& key, int64_t delta) {
  validateKey(key);
  int64_t result = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    int64_t current = 0;
    if (auto it = values_.find(key); it != values_.end()) {
      auto parsed = ddprun::parseInt(it->second);
      if (!parsed) throw ddprun::StateError("store key '" + key + "' does not hold a number");
      current = *parsed;
    }
    if ((delta > 0 && current > std::numeric_limits<int64_t>::max() - delta) ||
        (delta < 0 && current < std::numeric_limits<int64_t>::min() - delta)) {
      throw ddprun::StateError("store counter '" + key + "' would overflow");
    }
    result = current + delta;
    values_[key] = std::to_string(result);
  }
  changed_.notify_all();
  return result;
}

std::string InProcessStore::compareSet(const std::string& key, const std::string& expected,
                                      const std::string& desired) {
  validateKey(key);
  std::string result;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = values_.find(key);
    if (it == values_.end()) {
      if (!expected.empty()) return {};
      values_[key] = desired;
      result = desired;
    } else {
      if (it->second != expected) return it->second;
      it->second = desired;
      result = desired;
    }
  }
  changed_.notify_all();
  return result;
}

void InProcessStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  for (const auto& key : keys) validateKey(key);
  std::unique_lock<std::mutex> lock(mutex_);
  waitLocked(lock, keys, timeout);
}

bool InProcessStore::check(const std::vector<std::string>& keys) {
  for (const auto& key : keys) validateKey(key);
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& key : keys) {
    if (!values_.count(key)) return false;
  }
  return true;
}

bool InProcessStore::deleteKey(const std::string& key) {
  validateKey(key);
  std::lock_guard<std::mutex> lock(mutex_);
  return values_.erase(key) != 0;
}

int64_t InProcessStore::numKeys() {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(values_.size());
}

void InProcessStore::waitLocked(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                               std::chrono::milliseconds timeout) {
  auto allPresent = [&] {
    for (const auto& key : keys) {
      if (!values_.count(key)) return false;
    }
    return true;
  };
  // Bounded so that a huge timeout cannot overflow the clock arithmetic.
  const auto bounded = std::clamp(timeout, std::chrono::milliseconds(0), kLongestWait);
  if (changed_.wait_for(lock, bounded, allPresent)) return;
  std::vector<std::string> missing;
  for (const auto& key : keys) {
    if (!values_.count(key)) missing.push_back(key);
  }
  throw ddprun::TimeoutError("timed out after " + std::to_string(timeout.count()) +
                             " ms waiting for store key(s) " + quoted(missing));
}

}  // namespace ddp
