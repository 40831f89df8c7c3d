#include "store/forward/etcd_forwarding.h"

#include <algorithm>
#include <vector>

#include "common/error.h"
#include "common/store_prefix.h"
#include "store/core/store_limits.h"
#include "store/core/store_status.h"
#include "store/etcd/etcd_key_store.h"

namespace ddprun {

namespace {

using std::chrono::milliseconds;

std::vector<std::string> keysOf(const google::protobuf::RepeatedPtrField<std::string>& keys) {
  if (static_cast<std::size_t>(keys.size()) > kMaxStoreKeysPerRequest) {
    throw ConfigError("a store request names " + std::to_string(keys.size()) + " keys, more than " +
                      std::to_string(kMaxStoreKeysPerRequest));
  }
  for (const auto& key : keys) validateStoreKey(key);
  return {keys.begin(), keys.end()};
}

const std::string& key(const std::string& k) {
  validateStoreKey(k);
  return k;
}

const std::string& value(const std::string& k, const std::string& v) {
  validateStoreValue(k, v);
  return v;
}

// The request's scope; null for a ping (and an unknown operation).
const v1::Scope* scopeOf(const v1::StoreRequest& r) {
  switch (r.op_case()) {
    case v1::StoreRequest::kSet: return &r.set().scope();
    case v1::StoreRequest::kGet: return &r.get().scope();
    case v1::StoreRequest::kAdd: return &r.add().scope();
    case v1::StoreRequest::kCompareSet: return &r.compare_set().scope();
    case v1::StoreRequest::kWait: return &r.wait().scope();
    case v1::StoreRequest::kCheck: return &r.check().scope();
    case v1::StoreRequest::kDeleteKey: return &r.delete_key().scope();
    case v1::StoreRequest::kNumKeys: return &r.num_keys().scope();
    case v1::StoreRequest::kAppend: return &r.append().scope();
    case v1::StoreRequest::kMultiGet: return &r.multi_get().scope();
    case v1::StoreRequest::kMultiSet: return &r.multi_set().scope();
    case v1::StoreRequest::kListKeys: return &r.list_keys().scope();
    case v1::StoreRequest::kPing:
    case v1::StoreRequest::OP_NOT_SET:
      break;
  }
  return nullptr;
}

// One request on one round's store; throws the store's errors (common/error.h).
void run(EtcdKeyStore& store, const v1::StoreRequest& r, v1::StoreResponse& out) {
  switch (r.op_case()) {
    case v1::StoreRequest::kSet:
      store.set(key(r.set().key()), value(r.set().key(), r.set().value()));
      out.mutable_set();
      return;
    case v1::StoreRequest::kGet:
      out.mutable_get()->set_value(store.get(key(r.get().key()), milliseconds(r.get().timeout_ms())));
      return;
    case v1::StoreRequest::kAdd:
      out.mutable_add()->set_value(store.add(key(r.add().key()), r.add().delta()));
      return;
    case v1::StoreRequest::kCompareSet: {
      const auto& c = r.compare_set();
      bool wasMissing = false;
      auto* o = out.mutable_compare_set();
      o->set_value(store.compareSet(key(c.key()), value(c.key(), c.expected()), value(c.key(), c.desired()),
                                    &wasMissing));
      o->set_key_was_missing(wasMissing);
      return;
    }
    case v1::StoreRequest::kWait:
      store.wait(keysOf(r.wait().keys()), milliseconds(r.wait().timeout_ms()));
      out.mutable_wait();
      return;
    case v1::StoreRequest::kCheck:
      out.mutable_check()->set_all_present(store.check(keysOf(r.check().keys())));
      return;
    case v1::StoreRequest::kDeleteKey:
      out.mutable_delete_key()->set_deleted(store.deleteKey(key(r.delete_key().key())));
      return;
    case v1::StoreRequest::kNumKeys:
      out.mutable_num_keys()->set_count(store.numKeys());
      return;
    case v1::StoreRequest::kAppend:
      store.append(key(r.append().key()), value(r.append().key(), r.append().value()));
      out.mutable_append();
      return;
    case v1::StoreRequest::kMultiGet: {
      std::vector<bool> found;
      auto values = store.multiGet(keysOf(r.multi_get().keys()), &found);
      auto* o = out.mutable_multi_get();
      for (std::size_t i = 0; i < values.size(); ++i) {
        o->add_found(found[i]);
        o->add_values(std::move(values[i]));
      }
      return;
    }
    case v1::StoreRequest::kMultiSet: {
      const auto& m = r.multi_set();
      auto keys = keysOf(m.keys());
      if (m.values_size() != m.keys_size()) {
        throw ConfigError("multi_set has " + std::to_string(m.keys_size()) + " keys and " +
                          std::to_string(m.values_size()) + " values");
      }
      std::vector<std::string> values;
      for (int i = 0; i < m.values_size(); ++i) values.push_back(value(m.keys(i), m.values(i)));
      store.multiSet(keys, values);
      out.mutable_multi_set();
      return;
    }
    case v1::StoreRequest::kListKeys: {
      auto* o = out.mutable_list_keys();
      for (auto& k : store.listKeys()) o->add_keys(std::move(k));
      return;
    }
    case v1::StoreRequest::kPing:
    case v1::StoreRequest::OP_NOT_SET:
      break;
  }
}

}  // namespace

EtcdForwarding::EtcdForwarding(EtcdForwardingOptions options)
    : options_(std::move(options)), client_(std::make_shared<EtcdClient>(options_.client)) {
  while (!options_.root.empty() && options_.root.back() == '/') options_.root.pop_back();
}

EtcdForwarding::~EtcdForwarding() = default;

std::shared_ptr<EtcdKeyStore> EtcdForwarding::storeOf(const std::string& runId, uint64_t round) {
  std::lock_guard lock(mutex_);
  auto& slot = stores_[{runId, round}];
  if (!slot) {
    EtcdKeyStoreOptions o;
    o.prefix = options_.root + storePrefix(runId, round);
    o.fenceByRound = true;  // the etcd driver writes the round marker with the round
    slot = std::make_shared<EtcdKeyStore>(std::move(o), client_);
  }
  auto store = slot;
  // The oldest rounds' stores go (their in-flight calls keep theirs alive until they return).
  while (stores_.size() > std::max<std::size_t>(options_.roundsKept, 1)) {
    auto oldest = std::min_element(stores_.begin(), stores_.end(),
                                   [](const auto& a, const auto& b) { return a.first.second < b.first.second; });
    stores_.erase(oldest);
  }
  return store;
}

v1::StoreResponse EtcdForwarding::call(v1::StoreRequest& request, milliseconds /*timeout*/) {
  v1::StoreResponse response;
  response.set_id(request.id());
  try {
    if (request.op_case() == v1::StoreRequest::kPing) {
      response.mutable_ping();
      return response;
    }
    const v1::Scope* scope = scopeOf(request);
    if (!scope) {
      throw ConfigError("store request " + std::to_string(request.id()) + " names no operation this server knows");
    }
    if (scope->run_id().empty()) throw ConfigError("a store request without a run id");
    run(*storeOf(scope->run_id(), scope->round()), request, response);
  } catch (...) {
    const StoreStatus status = StoreStatus::fromCurrentException();
    response.clear_result();
    response.mutable_status()->set_code(static_cast<int32_t>(status.code));
    response.mutable_status()->set_message(status.message);
  }
  return response;
}

std::shared_ptr<StoreForwarder> EtcdForwarding::makeForwarder(std::shared_ptr<EtcdForwarding> etcd) {
  StoreForwarderOptions o;
  o.name = "etcd";
  for (const auto& endpoint : etcd->options_.client.endpoints) o.name += (o.name == "etcd" ? " " : ",") + endpoint;
  o.call = [etcd](v1::StoreRequest& request, milliseconds timeout) { return etcd->call(request, timeout); };
  return std::make_shared<StoreForwarder>(std::move(o));
}

}  // namespace ddprun
