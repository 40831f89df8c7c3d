// The store's operations as StoreRequest/StoreResponse messages (store.proto): what every
// transport carries, whether as they are (the Session stream, the store framing) or translated
// (the unary calls). Internal to the store's server side.
#pragma once

#include "ddprun/v1/store.pb.h"
#include "store/core/run_scoped_store.h"
#include "store/core/store_core.h"
#include "store/core/store_status.h"

namespace ddprun::detail {

inline StoreScope toScope(const v1::Scope& scope) { return StoreScope{scope.run_id(), scope.round()}; }

// Runs a request that never waits (set, add, compare_set, check, delete_key, num_keys, ping, append,
// multi_get, multi_set, list_keys) and
// fills its result into `response`. Takes the values out of `request`, which the caller reuses.
// Throws what the store throws; a stale round is a status, as is a request that is no such
// operation.
StoreStatus runQuickOp(StoreCore& core, v1::StoreRequest& request, v1::StoreResponse& response);

// Sets the response's status from `status` (nothing for OK: the default is OK on the wire).
void setStatus(v1::StoreResponse& response, const StoreStatus& status);

}  // namespace ddprun::detail
