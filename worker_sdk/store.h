// The workers' key-value store, in the style of gloo's rendezvous::Store and c10d's Store: bytes
// in, bytes out, and every call that waits has a timeout. Communicators bootstrap through it
// (gloo's addresses, NCCL's unique id); programs may use it for their own small agreements.
//
// Errors are exceptions from common/error.h: TimeoutError (naming the missing keys),
// ConnectionError (the store is unreachable), StateError (add() on a value that is not a number,
// or a stale round), ConfigError (an empty key).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace ddp {

class Store {
 public:
  // PyTorch's default store timeout.
  static constexpr std::chrono::milliseconds kDefaultTimeout{std::chrono::minutes(5)};

  virtual ~Store() = default;

  // Sets key to value, replacing any earlier value.
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Waits up to timeout() for the key to exist, then returns its value.
  virtual std::string get(const std::string& key) = 0;
  // Adds delta to the decimal counter under key (a missing key counts as 0); returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Sets desired when the key holds expected, or is missing and expected is empty. Returns the
  // value after the call; empty when the key is missing.
  virtual std::string compareSet(const std::string& key, const std::string& expected,
                                 const std::string& desired) = 0;
  // Waits until every key exists, up to timeout() or the given timeout.
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout()); }
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  // Whether every key exists now; never waits.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Removes the key; true when it existed.
  virtual bool deleteKey(const std::string& key) = 0;
  // The number of keys this store sees (its whole namespace).
  virtual int64_t numKeys() = 0;
  // How long get() and wait() without a timeout wait.
  virtual std::chrono::milliseconds timeout() const = 0;
};

}  // namespace ddp
