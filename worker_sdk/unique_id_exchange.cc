#include "worker_sdk/unique_id_exchange.h"

#include "common/error.h"

namespace ddp::detail {

std::string exchangeUniqueId(Store& store, int rank, const std::string& key, std::chrono::milliseconds timeout,
                             const std::function<std::string()>& create) {
  if (rank == 0) {
    std::string id = create();
    if (id.empty()) throw ddprun::StateError("the bootstrap id for '" + key + "' is empty");
    store.set(key, id);
    return id;
  }
  store.wait({key}, timeout);
  return store.get(key);
}

}  // namespace ddp::detail
