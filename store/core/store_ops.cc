#include "store/core/store_ops.h"

#include <string>
#include <utility>
#include <vector>

#include "store/core/store_limits.h"

namespace ddprun::detail {

namespace {

StoreStatus checkKeyCount(int count) {
  if (static_cast<std::size_t>(count) <= kMaxStoreKeysPerRequest) return {};
  return {StoreCode::kInvalidArgument, "a store request names " + std::to_string(count) + " keys, more than " +
                                           std::to_string(kMaxStoreKeysPerRequest)};
}

}  // namespace

StoreStatus runQuickOp(StoreCore& core, v1::StoreRequest& request, v1::StoreResponse& response) {
  RunScopedStore& store = core.store();
  // Each case checks the round of its own scope first.
  switch (request.op_case()) {
    case v1::StoreRequest::kSet: {
      auto& r = *request.mutable_set();
      if (auto s = core.roundStatus(toScope(r.scope())); !s.ok()) return s;
      store.set(toScope(r.scope()), r.key(), std::move(*r.mutable_value()));
      response.mutable_set();
      return {};
    }
    case v1::StoreRequest::kAdd: {
      const auto& r = request.add();
      if (auto s = core.roundStatus(toScope(r.scope())); !s.ok()) return s;
      response.mutable_add()->set_value(store.add(toScope(r.scope()), r.key(), r.delta()));
      return {};
    }
    case v1::StoreRequest::kCompareSet: {
      auto& r = *request.mutable_compare_set();
      if (auto s = core.roundStatus(toScope(r.scope())); !s.ok()) return s;
      bool wasMissing = false;
      auto* out = response.mutable_compare_set();
      out->set_value(
          store.compareSet(toScope(r.scope()), r.key(), r.expected(), std::move(*r.mutable_desired()), &wasMissing));
      out->set_key_was_missing(wasMissing);
      return {};
    }
    case v1::StoreRequest::kCheck: {
      const auto& r = request.check();
      if (auto s = core.roundStatus(toScope(r.scope())); !s.ok()) return s;
      std::vector<std::string> keys(r.keys().begin(), r.keys().end());
      response.mutable_check()->set_all_present(store.check(toScope(r.scope()), keys));
      return {};
    }
    case v1::StoreRequest::kDeleteKey: {
      const auto& r = request.delete_key();
      if (auto s = core.roundStatus(toScope(r.scope())); !s.ok()) return s;
      response.mutable_delete_key()->set_deleted(store.deleteKey(toScope(r.scope()), r.key()));
      return {};
    }
    case v1::StoreRequest::kPing:
      response.mutable_ping();
      return {};
    case v1::StoreRequest::kNumKeys: {
      const auto& r = request.num_keys();
      if (auto s = core.roundStatus(toScope(r.scope())); !s.ok()) return s;
      response.mutable_num_keys()->set_count(store.numKeys(toScope(r.scope())));
      return {};
    }
    case v1::StoreRequest::kAppend: {
      const auto& r = request.append();
      if (auto s = core.roundStatus(toScope(r.scope())); !s.ok()) return s;
      store.append(toScope(r.scope()), r.key(), r.value());
      response.mutable_append();
      return {};
    }
    case v1::StoreRequest::kMultiGet: {
      const auto& r = request.multi_get();
      if (auto s = core.roundStatus(toScope(r.scope())); !s.ok()) return s;
      if (auto s = checkKeyCount(r.keys_size()); !s.ok()) return s;
      auto* out = response.mutable_multi_get();
      for (const auto& key : r.keys()) {
        auto value = store.get(toScope(r.scope()), key);
        out->add_found(value.has_value());
        out->add_values(value ? std::move(*value) : std::string());
      }
      return {};
    }
    case v1::StoreRequest::kMultiSet: {
      auto& r = *request.mutable_multi_set();
      if (auto s = core.roundStatus(toScope(r.scope())); !s.ok()) return s;
      if (auto s = checkKeyCount(r.keys_size()); !s.ok()) return s;
      if (r.keys_size() != r.values_size()) {
        return {StoreCode::kInvalidArgument, "multi_set has " + std::to_string(r.keys_size()) + " keys and " +
                                                 std::to_string(r.values_size()) + " values"};
      }
      for (int i = 0; i < r.keys_size(); ++i) {
        store.set(toScope(r.scope()), r.keys(i), std::move(*r.mutable_values(i)));
      }
      response.mutable_multi_set();
      return {};
    }
    case v1::StoreRequest::kListKeys: {
      const auto& r = request.list_keys();
      if (auto s = core.roundStatus(toScope(r.scope())); !s.ok()) return s;
      for (auto& key : store.listKeys(toScope(r.scope()))) response.mutable_list_keys()->add_keys(std::move(key));
      response.mutable_list_keys();
      return {};
    }
    case v1::StoreRequest::kGet:
    case v1::StoreRequest::kWait:
      return {StoreCode::kInternal, "a blocking store operation reached runQuickOp"};
    case v1::StoreRequest::OP_NOT_SET:
      break;
  }
  // No operation, or one this server does not know (a newer client's): a field it cannot read.
  return {StoreCode::kInvalidArgument,
          "store request " + std::to_string(request.id()) + " names no operation this server knows"};
}

void setStatus(v1::StoreResponse& response, const StoreStatus& status) {
  if (status.ok()) return;
  auto* s = response.mutable_status();
  s->set_code(static_cast<int32_t>(status.code));
  s->set_message(status.message);  // bounded when the status was made
}

}  // namespace ddprun::detail
