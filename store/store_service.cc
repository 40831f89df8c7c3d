#include "store/store_service.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <exception>
#include <memory>
#include <new>

#include "common/error.h"
#include "rpc/grpc_util.h"
#include "store/store_session.h"
#include "store/store_session_ops.h"

namespace ddprun {

using detail::statusFromCurrentException;
using detail::toScope;

// One Get or Wait in flight. Three parties may end it: the store's callback (keys arrived, or the
// deadline, drop or close came first), client cancellation (OnCancel), and a failure to start.
// `finished` makes the first of them the only one to call Finish. The state lives in a
// shared_ptr, not in the reactor, because the reactor may be deleted (OnDone) as soon as Finish
// is called, possibly while start() is still returning from waitAsync on another thread.
struct StoreService::WaitCall : std::enable_shared_from_this<WaitCall> {
  struct Reactor final : grpc::ServerUnaryReactor {
    std::shared_ptr<WaitCall> call;
    void OnCancel() override { call->cancel(); }
    void OnDone() override { delete this; }
  };

  WaitCall(StoreService& s, StoreScope sc, std::vector<std::string> k, uint32_t t,
           RunScopedStore::TimePoint d, OnSatisfied f)
      : service(s), scope(std::move(sc)), keys(std::move(k)), timeoutMs(t), deadline(d),
        onSatisfied(std::move(f)) {}

  void start() {
    std::optional<RunScopedStore::WaitId> id;
    try {
      id = service.store_.waitAsync(scope, keys, deadline,
                                    [self = shared_from_this()](bool ok) { self->waitDone(ok); });
    } catch (...) {
      finish(statusFromCurrentException());
      return;
    }
    if (!id) {
      finish({grpc::StatusCode::RESOURCE_EXHAUSTED, "too many pending store waits for run '" +
                                                        scope.runId + "'"});
      return;
    }
    bool cancelNow = false;
    {
      std::lock_guard lock(mutex);
      waitId = id;
      cancelNow = cancelled && !finished;
    }
    if (cancelNow) {
      cancelWait(*id);
    } else {
      service.wakeTimer(deadline);
    }
  }

  // From OnCancel: the client gave up, its deadline passed, or the server shuts down.
  void cancel() {
    std::optional<RunScopedStore::WaitId> id;
    {
      std::lock_guard lock(mutex);
      cancelled = true;
      if (finished || !waitId) return;  // start() sees `cancelled` once it has the id
      id = waitId;
    }
    cancelWait(*id);
  }

  void cancelWait(RunScopedStore::WaitId id) {
    // False: the callback runs or ran, and it finishes the call.
    if (service.store_.cancelWait(id)) finish({grpc::StatusCode::CANCELLED, "store call cancelled"});
  }

  void waitDone(bool satisfied) {
    try {
      std::optional<grpc::Status> status =
          satisfied ? onSatisfied()
                    : detail::waitFailure(service.store_, service.options_, scope, keys, timeoutMs);
      if (!status && !satisfied) status = onSatisfied();
      if (status) {
        finish(*status);
      } else {
        start();  // a key was deleted between the wake-up and the read: wait on
      }
    } catch (...) {
      finish(statusFromCurrentException());
    }
  }

  void finish(const grpc::Status& status) {
    {
      std::lock_guard lock(mutex);
      if (finished) return;
      finished = true;
    }
    reactor->Finish(bounded(status));
  }

  StoreService& service;
  grpc::ServerUnaryReactor* reactor = nullptr;
  const StoreScope scope;
  const std::vector<std::string> keys;
  const uint32_t timeoutMs;
  const RunScopedStore::TimePoint deadline;
  const OnSatisfied onSatisfied;
  std::mutex mutex;
  std::optional<RunScopedStore::WaitId> waitId;
  bool cancelled = false;
  bool finished = false;
};

StoreService::StoreService(StoreServiceOptions options, RunScopedStoreOptions storeOptions)
    : options_(std::move(options)), store_(storeOptions), timer_([this] { timerLoop(); }) {}

StoreService::~StoreService() { shutdown(); }

void StoreService::shutdown() {
  store_.close();  // fails every pending wait, the sessions' too
  std::vector<std::shared_ptr<StoreSession>> sessions;
  {
    std::lock_guard lock(sessionsMutex_);
    sessionsClosed_ = true;
    for (auto& [raw, weak] : sessions_) {
      if (auto session = weak.lock()) sessions.push_back(std::move(session));
    }
  }
  // Outside the lock: ending a session may complete its reactor, which calls removeSession().
  for (auto& session : sessions) {
    session->end({grpc::StatusCode::UNAVAILABLE, "the store is shutting down"});
  }
  {
    std::lock_guard lock(timerMutex_);
    stopping_ = true;
  }
  timerCv_.notify_all();
  if (timer_.joinable()) timer_.join();
}

void StoreService::removeSession(StoreSession* session) {
  std::lock_guard lock(sessionsMutex_);
  sessions_.erase(session);
}

grpc::ServerBidiReactor<v1::StoreRequest, v1::StoreResponse>* StoreService::Session(
    grpc::CallbackServerContext* context) {
  grpc::Status status = checkCaller(context);
  auto session = std::make_shared<StoreSession>(*this);
  if (status.ok()) {
    std::lock_guard lock(sessionsMutex_);
    if (sessionsClosed_) {
      status = {grpc::StatusCode::UNAVAILABLE, "the store is shutting down"};
    } else {
      sessions_.emplace(session.get(), session);
    }
  }
  return StoreSession::start(std::move(session), status);
}

grpc::Status StoreService::checkCaller(grpc::CallbackServerContext* context) const {
  grpc::Status status = tokenStatus(context);
  if (options_.admitCall && !options_.admitCall(context->peer(), status.ok())) {
    return {grpc::StatusCode::RESOURCE_EXHAUSTED, kConnectionClosedForAbuse};
  }
  return status;
}

bool StoreService::acceptsToken(std::string_view token) const {
  return options_.token.empty() || constantTimeEquals(token, options_.token);
}

grpc::Status StoreService::tokenStatus(grpc::CallbackServerContext* context) const {
  if (!tokenAuthorized(*context, options_.token)) {
    // Never log the token itself, not even the wrong one: it may be a near miss.
    if (auto held = refusalLog_.allow()) {
      spdlog::warn("store: refused a call from {}: missing or wrong job token{}", context->peer(), heldBackNote(*held));
    }
    return {grpc::StatusCode::UNAUTHENTICATED, "invalid job token"};
  }
  return grpc::Status::OK;
}

grpc::Status StoreService::admit(grpc::CallbackServerContext* context, const v1::Scope& scope) const {
  grpc::Status status = checkCaller(context);
  return status.ok() ? detail::roundStatus(options_, scope) : status;
}

grpc::ServerUnaryReactor* StoreService::unary(grpc::CallbackServerContext* context,
                                              const v1::Scope& scope,
                                              const std::function<void()>& body) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  grpc::Status status;
  try {
    status = admit(context, scope);
    if (status.ok()) body();
  } catch (...) {
    status = statusFromCurrentException();
  }
  reactor->Finish(bounded(status));
  return reactor;
}

grpc::ServerUnaryReactor* StoreService::blocking(grpc::CallbackServerContext* context,
                                                 const v1::Scope& scope,
                                                 std::vector<std::string> keys, uint32_t timeoutMs,
                                                 OnSatisfied onSatisfied) {
  grpc::Status status;
  try {
    status = admit(context, scope);
  } catch (...) {
    status = statusFromCurrentException();
  }
  if (!status.ok()) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(bounded(status));
    return reactor;
  }
  // The wait ends at its own timeout or the client's deadline, whichever comes first.
  const auto now = RunScopedStore::Clock::now();
  auto deadline = now + std::chrono::milliseconds(timeoutMs);
  const auto clientLeft = context->deadline() - std::chrono::system_clock::now();
  if (clientLeft < deadline - now) {
    deadline = now + std::chrono::duration_cast<RunScopedStore::Clock::duration>(
                         std::max(clientLeft, decltype(clientLeft)::zero()));
  }
  auto call = std::make_shared<WaitCall>(*this, toScope(scope), std::move(keys), timeoutMs, deadline,
                                         std::move(onSatisfied));
  auto* reactor = new WaitCall::Reactor();
  reactor->call = call;
  call->reactor = reactor;
  call->start();
  return reactor;
}

void StoreService::wakeTimer(RunScopedStore::TimePoint deadline) {
  {
    std::lock_guard lock(timerMutex_);
    // The timer wakes by then anyway and sees this deadline: no need to wake it now (a store
    // answering thousands of waits a second would otherwise switch to the timer for each).
    // min(): the timer is reading the next deadline and may have missed this one.
    if (timerTarget_ != RunScopedStore::TimePoint::min() && deadline >= timerTarget_) return;
    ++timerGeneration_;
  }
  timerCv_.notify_all();
}

void StoreService::timerLoop() {
  std::unique_lock lock(timerMutex_);
  while (!stopping_) {
    // Read the generation before the deadline, with the target at its minimum: a wait added in
    // between bumps the generation, so it is never missed.
    const uint64_t seen = timerGeneration_;
    timerTarget_ = RunScopedStore::TimePoint::min();
    lock.unlock();
    const auto next = store_.nextDeadline();
    lock.lock();
    const auto woken = [&] { return stopping_ || timerGeneration_ != seen; };
    timerTarget_ = next.value_or(RunScopedStore::TimePoint::max());
    if (next) {
      timerCv_.wait_until(lock, *next, woken);
    } else {
      timerCv_.wait(lock, woken);
    }
    if (stopping_) break;
    lock.unlock();
    store_.expire(RunScopedStore::Clock::now());
    lock.lock();
  }
}

grpc::ServerUnaryReactor* StoreService::Set(grpc::CallbackServerContext* context,
                                            const v1::SetRequest* request, v1::SetResponse*) {
  return unary(context, request->scope(),
               [&] { store_.set(toScope(request->scope()), request->key(), request->value()); });
}

grpc::ServerUnaryReactor* StoreService::Get(grpc::CallbackServerContext* context,
                                            const v1::GetRequest* request,
                                            v1::GetResponse* response) {
  StoreScope scope = toScope(request->scope());
  std::string key = request->key();
  return blocking(context, request->scope(), {key}, request->timeout_ms(),
                  [this, scope, key, response]() -> std::optional<grpc::Status> {
                    auto value = store_.get(scope, key);
                    if (!value) return std::nullopt;
                    response->set_value(std::move(*value));
                    return grpc::Status::OK;
                  });
}

grpc::ServerUnaryReactor* StoreService::Add(grpc::CallbackServerContext* context,
                                            const v1::AddRequest* request,
                                            v1::AddResponse* response) {
  return unary(context, request->scope(), [&] {
    response->set_value(store_.add(toScope(request->scope()), request->key(), request->delta()));
  });
}

grpc::ServerUnaryReactor* StoreService::CompareSet(grpc::CallbackServerContext* context,
                                                   const v1::CompareSetRequest* request,
                                                   v1::CompareSetResponse* response) {
  return unary(context, request->scope(), [&] {
    response->set_value(store_.compareSet(toScope(request->scope()), request->key(),
                                          request->expected(), request->desired()));
  });
}

grpc::ServerUnaryReactor* StoreService::Wait(grpc::CallbackServerContext* context,
                                             const v1::WaitRequest* request, v1::WaitResponse*) {
  std::vector<std::string> keys(request->keys().begin(), request->keys().end());
  return blocking(context, request->scope(), std::move(keys), request->timeout_ms(),
                  []() -> std::optional<grpc::Status> { return grpc::Status::OK; });
}

grpc::ServerUnaryReactor* StoreService::Check(grpc::CallbackServerContext* context,
                                              const v1::CheckRequest* request,
                                              v1::CheckResponse* response) {
  return unary(context, request->scope(), [&] {
    std::vector<std::string> keys(request->keys().begin(), request->keys().end());
    response->set_all_present(store_.check(toScope(request->scope()), keys));
  });
}

grpc::ServerUnaryReactor* StoreService::Delete(grpc::CallbackServerContext* context,
                                               const v1::DeleteRequest* request,
                                               v1::DeleteResponse* response) {
  return unary(context, request->scope(), [&] {
    response->set_deleted(store_.deleteKey(toScope(request->scope()), request->key()));
  });
}

grpc::ServerUnaryReactor* StoreService::NumKeys(grpc::CallbackServerContext* context,
                                                const v1::NumKeysRequest* request,
                                                v1::NumKeysResponse* response) {
  return unary(context, request->scope(),
               [&] { response->set_count(store_.numKeys(toScope(request->scope()))); });
}

}  // namespace ddprun
