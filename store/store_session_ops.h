// What the Store service's unary calls and its Session streams share: turning the store's
// exceptions into statuses, the round check, why a wait failed, and the operations that complete
// at once. Internal to the server (store_service.cc, store_session.cc).
#pragma once

#include <grpcpp/support/status.h>

#include <optional>
#include <string>
#include <vector>

#include "ddprun/v1/store.pb.h"
#include "store/run_scoped_store.h"
#include "store/store_service.h"

namespace ddprun::detail {

inline StoreScope toScope(const v1::Scope& scope) { return StoreScope{scope.run_id(), scope.round()}; }

// The one place where the store's exceptions become statuses; StoreClient maps them back. Call
// only from a catch block.
grpc::Status statusFromCurrentException();

// FAILED_PRECONDITION when the scope's round may not use the store; OK otherwise.
grpc::Status roundStatus(const StoreServiceOptions& options, const v1::Scope& scope);

// Why a wait ended without its keys: the store closed, a stale round, or its timeout; nullopt
// when the keys exist after all (they arrived just as the deadline passed).
std::optional<grpc::Status> waitFailure(const RunScopedStore& store, const StoreServiceOptions& options,
                                        const StoreScope& scope, const std::vector<std::string>& keys,
                                        uint32_t timeoutMs);

// Runs a request that never waits (set, add, compare_set, check, delete_key, num_keys) and fills
// its result into `response`. Takes the values out of `request`, which the caller reuses. Throws
// what the store throws; a stale round is a status, as is a request that is no such operation.
grpc::Status runQuickOp(RunScopedStore& store, const StoreServiceOptions& options,
                        v1::StoreRequest& request, v1::StoreResponse& response);

// Sets the response's status from `status` (nothing for OK: the default is OK on the wire).
void setStatus(v1::StoreResponse& response, const grpc::Status& status);

}  // namespace ddprun::detail
