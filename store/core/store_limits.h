// Limits of the workers' key-value store, shared by the server (RunScopedStore) and the client, which
// rejects bad keys and values before sending them. Header-only on purpose: the store client
// library (what the worker SDK links) must not need the server's code.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/strings.h"

namespace ddprun {

inline constexpr std::size_t kMaxStoreKeyBytes = 4 * 1024;
inline constexpr std::size_t kMaxStoreValueBytes = 64 * 1024 * 1024;
// Keys one multi-key request (multi_get, multi_set; a TCPStore check or wait) may name at most.
inline constexpr std::size_t kMaxStoreKeysPerRequest = 4096;
// The largest message of any store transport: a value with its key and framing (the gRPC
// transport's message limit, rpc/grpc_util.h, is the same number).
inline constexpr std::size_t kMaxStoreMessageBytes = 80 * 1024 * 1024;
// A connection stops reading requests while this much of its answers waits for a client that does
// not read them, whatever the transport: a client cannot grow the server's memory by not reading.
inline constexpr std::size_t kMaxQueuedAnswerBytes = 64 * 1024 * 1024;

// Throws ConfigError for an empty key or one over kMaxStoreKeyBytes.
inline void validateStoreKey(const std::string& key) {
  if (key.empty()) throw ConfigError("store key is empty");
  if (key.size() > kMaxStoreKeyBytes) {
    throw ConfigError("store key is " + std::to_string(key.size()) + " bytes, more than " +
                      std::to_string(kMaxStoreKeyBytes));
  }
}

// Throws ConfigError for a value over kMaxStoreValueBytes.
inline void validateStoreValue(const std::string& key, const std::string& value) {
  if (value.size() > kMaxStoreValueBytes) {
    throw ConfigError("value for store key '" + printable(key, 64) + "' is " + std::to_string(value.size()) +
                      " bytes, more than " + std::to_string(kMaxStoreValueBytes));
  }
}

// 'a', 'b' and 3 more: keys for an error message, bounded for waits on thousands of long keys.
inline std::string quoteKeys(const std::vector<std::string>& keys) {
  constexpr std::size_t kShown = 8;
  std::string out;
  for (std::size_t i = 0; i < keys.size() && i < kShown; ++i) {
    out += (i == 0 ? "'" : ", '") + printable(keys[i], 64) + "'";
  }
  if (keys.size() > kShown) out += " and " + std::to_string(keys.size() - kShown) + " more";
  return out;
}

}  // namespace ddprun
