#include "store/tcpstore/tcpstore_requests.h"

#include <utility>

namespace ddprun::tcpstore {

void toStoreRequest(Command& c, const StoreScope& scope, uint32_t waitTimeoutMs, v1::StoreRequest& request,
                    Owed& owed) {
  auto scoped = [&](auto* m) {
    m->mutable_scope()->set_run_id(scope.runId);
    m->mutable_scope()->set_round(scope.round);
  };
  switch (c.op) {
    case Op::kSet: {
      auto* m = request.mutable_set();
      scoped(m);
      m->set_key(std::move(c.keys[0]));
      m->set_value(std::move(c.values[0]));
      return;
    }
    case Op::kAppend: {
      auto* m = request.mutable_append();
      scoped(m);
      m->set_key(std::move(c.keys[0]));
      m->set_value(std::move(c.values[0]));
      return;
    }
    case Op::kCompareSet: {
      auto* m = request.mutable_compare_set();
      scoped(m);
      m->set_key(std::move(c.keys[0]));
      owed.expected = c.values[0];
      m->set_expected(std::move(c.values[0]));
      m->set_desired(std::move(c.values[1]));
      owed.reply = Reply::kCompareSet;
      return;
    }
    case Op::kGet:
    case Op::kMultiGet: {
      // torch's GET does not wait (its client waits first) and reads a missing key as empty.
      auto* m = request.mutable_multi_get();
      scoped(m);
      for (auto& k : c.keys) m->add_keys(std::move(k));
      owed.reply = c.op == Op::kGet ? Reply::kValue : Reply::kMultiGet;
      return;
    }
    case Op::kAdd: {
      auto* m = request.mutable_add();
      scoped(m);
      m->set_key(std::move(c.keys[0]));
      m->set_delta(c.number);
      owed.reply = Reply::kAdd;
      return;
    }
    case Op::kCheck: {
      auto* m = request.mutable_check();
      scoped(m);
      for (auto& k : c.keys) m->add_keys(std::move(k));
      owed.reply = Reply::kCheck;
      return;
    }
    case Op::kWait: {
      auto* m = request.mutable_wait();
      scoped(m);
      for (auto& k : c.keys) m->add_keys(std::move(k));
      m->set_timeout_ms(waitTimeoutMs);
      owed.reply = Reply::kWait;
      return;
    }
    case Op::kNumKeys:
      scoped(request.mutable_num_keys());
      owed.reply = Reply::kNumKeys;
      return;
    case Op::kDelete: {
      auto* m = request.mutable_delete_key();
      scoped(m);
      m->set_key(std::move(c.keys[0]));
      owed.reply = Reply::kDelete;
      return;
    }
    case Op::kMultiSet: {
      auto* m = request.mutable_multi_set();
      scoped(m);
      for (auto& k : c.keys) m->add_keys(std::move(k));
      for (auto& v : c.values) m->add_values(std::move(v));
      return;
    }
    case Op::kListKeys:
      scoped(request.mutable_list_keys());
      owed.reply = Reply::kListKeys;
      return;
    case Op::kValidate:
    case Op::kPing:
    case Op::kCancelWait:
    case Op::kQueuePush:
    case Op::kQueuePop:
    case Op::kQueueLen:
    case Op::kBarrier:
    case Op::kWatchKey:
      return;  // the connection's own (see the header)
  }
}

void encodeAnswer(const Owed& owed, const v1::StoreResponse& r, std::string& out) {
  switch (owed.reply) {
    case Reply::kNone:
      return;
    case Reply::kValue:
      appendBytes(out, r.multi_get().values_size() > 0 ? r.multi_get().values(0) : std::string());
      return;
    case Reply::kMultiGet:
      for (const auto& v : r.multi_get().values()) appendBytes(out, v);
      return;
    case Reply::kCompareSet:
      // torch answers a missing key with `expected` (and sets nothing) unless that is empty.
      appendBytes(out, r.compare_set().key_was_missing() && !owed.expected.empty()
                                     ? owed.expected
                                     : r.compare_set().value());
      return;
    case Reply::kAdd:
      appendI64(out, r.add().value());
      return;
    case Reply::kCheck:
      appendU8(out, r.check().all_present() ? kCheckReady : kCheckNotReady);
      return;
    case Reply::kWait:
      appendU8(out, kStopWaiting);
      return;
    case Reply::kDelete:
      appendI64(out, r.delete_key().deleted() ? 1 : 0);
      return;
    case Reply::kNumKeys:
      appendI64(out, r.num_keys().count());
      return;
    case Reply::kListKeys:
      appendI64(out, r.list_keys().keys_size());
      for (const auto& k : r.list_keys().keys()) appendBytes(out, k);
      return;
  }
}


}  // namespace ddprun::tcpstore
