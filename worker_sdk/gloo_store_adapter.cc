#include "worker_sdk/gloo_store_adapter.h"

#include <algorithm>

namespace ddp::detail {

GlooStoreAdapter::GlooStoreAdapter(ddp::Store& store, std::chrono::milliseconds timeout)
    : store_(store), timeout_(timeout) {}

void GlooStoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  store_.set(key, std::string(data.begin(), data.end()));
}

std::vector<char> GlooStoreAdapter::get(const std::string& key) {
  store_.wait({key}, timeout_);
  const std::string value = store_.get(key);
  return std::vector<char>(value.begin(), value.end());
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys) { store_.wait(keys, timeout_); }

void GlooStoreAdapter::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  // gloo passes its context's timeout; never wait longer than this communicator allows.
  store_.wait(keys, std::min(timeout, timeout_));
}

}  // namespace ddp::detail
