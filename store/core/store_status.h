// The outcome of a store operation, whatever transport carries it. The codes are numbered as
// gRPC's, because that is what every transport's StoreResponse.status.code carries and what the
// client maps back to exceptions (store/client); the gRPC adapter converts with a static_cast that
// store/grpc/grpc_status.h checks code by code.
#pragma once

#include <cstdint>
#include <string>

namespace ddprun {

enum class StoreCode : int32_t {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kInternal = 13,
  kUnavailable = 14,
  kUnauthenticated = 16,
};

struct StoreStatus {
  StoreCode code = StoreCode::kOk;
  std::string message;

  StoreStatus() = default;
  // The message is cut to kMaxErrorMessageBytes: no answer of the store echoes unbounded input.
  StoreStatus(StoreCode c, std::string m);

  bool ok() const { return code == StoreCode::kOk; }

  // The one place where the store's exceptions (common/error.h) become statuses; the client maps
  // them back. Call only from a catch block.
  static StoreStatus fromCurrentException();
};

}  // namespace ddprun
