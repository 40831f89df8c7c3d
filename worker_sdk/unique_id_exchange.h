// How ranks agree on one bootstrap secret (NCCL's ncclUniqueId) through the store (internal, but
// backend-neutral so that it is tested without a GPU).
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "worker_sdk/store.h"

namespace ddp::detail {

// Rank 0 calls create() and publishes the bytes under key; every other rank waits up to timeout
// for the key and reads it. Returns the same bytes on every rank. The store is scoped by run id
// and round, so a restarted group never reads the id of the round before.
std::string exchangeUniqueId(Store& store, int rank, const std::string& key, std::chrono::milliseconds timeout,
                             const std::function<std::string()>& create);

}  // namespace ddp::detail
