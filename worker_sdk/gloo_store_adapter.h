// gloo's rendezvous::Store over a ddp::Store (internal): gloo's connectFullMesh exchanges the
// ranks' addresses through it. Include only from gloo translation units.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <string>
#include <vector>

#include "worker_sdk/store.h"

namespace ddp::detail {

class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  // `store` (already prefixed) must outlive the adapter; every wait is bounded by `timeout`.
  GlooStoreAdapter(ddp::Store& store, std::chrono::milliseconds timeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  ddp::Store& store_;
  const std::chrono::milliseconds timeout_;
};

}  // namespace ddp::detail
