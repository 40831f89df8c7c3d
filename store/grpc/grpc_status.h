// StoreStatus <-> grpc::Status, for the store's gRPC adapter only.
#pragma once

#include <grpcpp/support/status.h>

#include "store/core/store_status.h"

namespace ddprun::detail {

// StoreCode is numbered as gRPC's codes (store_status.h): checked here, code by code.
static_assert(static_cast<int>(StoreCode::kCancelled) == grpc::StatusCode::CANCELLED);
static_assert(static_cast<int>(StoreCode::kUnknown) == grpc::StatusCode::UNKNOWN);
static_assert(static_cast<int>(StoreCode::kInvalidArgument) == grpc::StatusCode::INVALID_ARGUMENT);
static_assert(static_cast<int>(StoreCode::kDeadlineExceeded) == grpc::StatusCode::DEADLINE_EXCEEDED);
static_assert(static_cast<int>(StoreCode::kResourceExhausted) == grpc::StatusCode::RESOURCE_EXHAUSTED);
static_assert(static_cast<int>(StoreCode::kFailedPrecondition) == grpc::StatusCode::FAILED_PRECONDITION);
static_assert(static_cast<int>(StoreCode::kInternal) == grpc::StatusCode::INTERNAL);
static_assert(static_cast<int>(StoreCode::kUnavailable) == grpc::StatusCode::UNAVAILABLE);
static_assert(static_cast<int>(StoreCode::kUnauthenticated) == grpc::StatusCode::UNAUTHENTICATED);

inline grpc::Status toGrpc(const StoreStatus& status) {
  if (status.ok()) return grpc::Status::OK;
  return {static_cast<grpc::StatusCode>(status.code), status.message};
}

}  // namespace ddprun::detail
