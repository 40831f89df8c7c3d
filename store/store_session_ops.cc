#include "store/store_session_ops.h"

#include <exception>
#include <new>

#include "common/error.h"
#include "common/ids.h"
#include "rpc/grpc_util.h"

namespace ddprun::detail {

grpc::Status statusFromCurrentException() {
  try {
    throw;
  } catch (const ConfigError& e) {
    return {grpc::StatusCode::INVALID_ARGUMENT, e.what()};
  } catch (const TimeoutError& e) {
    return {grpc::StatusCode::DEADLINE_EXCEEDED, e.what()};
  } catch (const ClosedError& e) {
    return {grpc::StatusCode::UNAVAILABLE, e.what()};
  } catch (const ConnectionError& e) {
    return {grpc::StatusCode::UNAVAILABLE, e.what()};
  } catch (const StateError& e) {
    return {grpc::StatusCode::FAILED_PRECONDITION, e.what()};
  } catch (const CapacityError& e) {
    return {grpc::StatusCode::RESOURCE_EXHAUSTED, e.what()};
  } catch (const std::bad_alloc&) {
    return {grpc::StatusCode::RESOURCE_EXHAUSTED, "the store is out of memory"};
  } catch (const std::exception& e) {
    return {grpc::StatusCode::INTERNAL, e.what()};
  } catch (...) {
    return {grpc::StatusCode::UNKNOWN, "unknown error in the store"};
  }
}

grpc::Status roundStatus(const StoreServiceOptions& options, const v1::Scope& scope) {
  // Checked first, so that no later message can echo an unbounded run id.
  if (auto problem = idProblem(scope.run_id())) return {grpc::StatusCode::INVALID_ARGUMENT, "run id " + *problem};
  if (options.roundIsCurrent && !options.roundIsCurrent(scope.run_id(), scope.round())) {
    if (options.jobExists && !options.jobExists(scope.run_id())) {
      return {grpc::StatusCode::FAILED_PRECONDITION,
              "no job '" + scope.run_id() + "' on this rendezvous server (none joined with that run id, or it is over)"};
    }
    return {grpc::StatusCode::FAILED_PRECONDITION,
            "stale round " + std::to_string(scope.round()) + " of run '" + scope.run_id() +
                "': the store serves only the job's current round"};
  }
  return grpc::Status::OK;
}

std::optional<grpc::Status> waitFailure(const RunScopedStore& store, const StoreServiceOptions& options,
                                        const StoreScope& scope, const std::vector<std::string>& keys,
                                        uint32_t timeoutMs) {
  if (store.closed()) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the store is closed");
  if (options.roundIsCurrent && !options.roundIsCurrent(scope.runId, scope.round)) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "stale round " + std::to_string(scope.round) + " of run '" + scope.runId +
                            "': the round ended while waiting");
  }
  const auto missing = store.missing(scope, keys);
  if (missing.empty()) return std::nullopt;
  return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                      "timed out after " + std::to_string(timeoutMs) + " ms waiting for store key(s) " +
                          quoteKeys(missing) + " of run '" + scope.runId + "' round " +
                          std::to_string(scope.round));
}

grpc::Status runQuickOp(RunScopedStore& store, const StoreServiceOptions& options,
                        v1::StoreRequest& request, v1::StoreResponse& response) {
  // Each case checks the round of its own scope first, as the unary calls do.
  switch (request.op_case()) {
    case v1::StoreRequest::kSet: {
      auto& r = *request.mutable_set();
      if (auto s = roundStatus(options, r.scope()); !s.ok()) return s;
      store.set(toScope(r.scope()), r.key(), std::move(*r.mutable_value()));
      response.mutable_set();
      return grpc::Status::OK;
    }
    case v1::StoreRequest::kAdd: {
      const auto& r = request.add();
      if (auto s = roundStatus(options, r.scope()); !s.ok()) return s;
      response.mutable_add()->set_value(store.add(toScope(r.scope()), r.key(), r.delta()));
      return grpc::Status::OK;
    }
    case v1::StoreRequest::kCompareSet: {
      auto& r = *request.mutable_compare_set();
      if (auto s = roundStatus(options, r.scope()); !s.ok()) return s;
      response.mutable_compare_set()->set_value(
          store.compareSet(toScope(r.scope()), r.key(), r.expected(), std::move(*r.mutable_desired())));
      return grpc::Status::OK;
    }
    case v1::StoreRequest::kCheck: {
      const auto& r = request.check();
      if (auto s = roundStatus(options, r.scope()); !s.ok()) return s;
      std::vector<std::string> keys(r.keys().begin(), r.keys().end());
      response.mutable_check()->set_all_present(store.check(toScope(r.scope()), keys));
      return grpc::Status::OK;
    }
    case v1::StoreRequest::kDeleteKey: {
      const auto& r = request.delete_key();
      if (auto s = roundStatus(options, r.scope()); !s.ok()) return s;
      response.mutable_delete_key()->set_deleted(store.deleteKey(toScope(r.scope()), r.key()));
      return grpc::Status::OK;
    }
    case v1::StoreRequest::kPing:
      response.mutable_ping();
      return grpc::Status::OK;
    case v1::StoreRequest::kNumKeys: {
      const auto& r = request.num_keys();
      if (auto s = roundStatus(options, r.scope()); !s.ok()) return s;
      response.mutable_num_keys()->set_count(store.numKeys(toScope(r.scope())));
      return grpc::Status::OK;
    }
    case v1::StoreRequest::kGet:
    case v1::StoreRequest::kWait:
      return {grpc::StatusCode::INTERNAL, "a blocking store operation reached runQuickOp"};
    case v1::StoreRequest::OP_NOT_SET:
      break;
  }
  // No operation, or one this server does not know (a newer client's): a field it cannot read.
  return {grpc::StatusCode::INVALID_ARGUMENT, "store request " + std::to_string(request.id()) +
                                                  " names no operation this server knows"};
}

void setStatus(v1::StoreResponse& response, const grpc::Status& status) {
  if (status.ok()) return;
  auto* s = response.mutable_status();
  s->set_code(static_cast<int32_t>(status.error_code()));
  s->set_message(bounded(status).error_message());
}

}  // namespace ddprun::detail
