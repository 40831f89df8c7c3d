#include "store/grpc/store_service.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "rpc/grpc_util.h"
#include "store/core/store_request_handler.h"
#include "store/grpc/grpc_status.h"
#include "store/grpc/store_session.h"

namespace ddprun {

using detail::toGrpc;

// One unary call: its request runs through a StoreRequestHandler of its own, like a Session stream
// of one request. Two parties may end it: the handler's answer (at once, or from a wait's callback
// or the core's timer) and client cancellation (OnCancel). `finished` lets the first of them
// alone call Finish. The state lives in a shared_ptr, not in the reactor, because gRPC deletes the
// reactor (OnDone) as soon as Finish is called, maybe while the handler is still answering on
// another thread; the handler's sink holds it weakly, so nothing holds it in a circle.
class StoreService::UnaryCall : public std::enable_shared_from_this<UnaryCall> {
 public:
  struct Reactor final : grpc::ServerUnaryReactor {
    std::shared_ptr<UnaryCall> call;
    void OnCancel() override { call->cancel(); }
    void OnDone() override { delete this; }
  };

  explicit UnaryCall(std::function<void(v1::StoreResponse&)> fill) : fill_(std::move(fill)) {}

  // Starts the call; returns its reactor for gRPC.
  static grpc::ServerUnaryReactor* start(StoreCore& core, std::shared_ptr<UnaryCall> call, v1::StoreRequest& request) {
    auto* reactor = new Reactor();
    reactor->call = call;
    call->reactor_ = reactor;
    std::weak_ptr<UnaryCall> weak = call;
    call->handler_ = std::make_shared<StoreRequestHandler>(core, [weak](v1::StoreResponse&& response) {
      if (auto self = weak.lock()) self->answer(response);
    });
    call->handler_->handle(request);
    return reactor;
  }

  // From OnCancel: the client gave up, its deadline passed, or the server shuts down.
  void cancel() {
    if (!claim()) return;
    handler_->end();  // forgets the wait in the store
    reactor_->Finish({grpc::StatusCode::CANCELLED, "store call cancelled"});
  }

 private:
  void answer(v1::StoreResponse& response) {
    if (!claim()) return;
    if (response.has_status() && response.status().code() != 0) {
      reactor_->Finish({static_cast<grpc::StatusCode>(response.status().code()), response.status().message()});
      return;
    }
    fill_(response);
    reactor_->Finish(grpc::Status::OK);
  }

  bool claim() {
    std::lock_guard lock(mutex_);
    if (finished_) return false;
    finished_ = true;
    return true;
  }

  const std::function<void(v1::StoreResponse&)> fill_;
  grpc::ServerUnaryReactor* reactor_ = nullptr;  // valid until Finish
  std::shared_ptr<StoreRequestHandler> handler_;
  std::mutex mutex_;
  bool finished_ = false;
};

StoreService::StoreService(StoreCore& core, StoreServiceOptions options) : core_(core), options_(std::move(options)) {}

StoreService::~StoreService() { shutdown(); }

void StoreService::shutdown() {
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
  const bool authenticated = core_.acceptsToken(callToken(*context));
  if (!authenticated) core_.logRefusedToken("a call from " + context->peer());
  if (options_.admitCall && !options_.admitCall(context->peer(), authenticated)) {
    return {grpc::StatusCode::RESOURCE_EXHAUSTED, kConnectionClosedForAbuse};
  }
  return authenticated ? grpc::Status::OK : grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "invalid job token");
}

grpc::ServerUnaryReactor* StoreService::unary(grpc::CallbackServerContext* context, v1::StoreRequest request,
                                              std::function<void(v1::StoreResponse&)> fill) {
  if (grpc::Status status = checkCaller(context); !status.ok()) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(status);
    return reactor;
  }
  // A wait ends at its own timeout or the client's deadline, whichever comes first.
  const auto clientLeft = std::chrono::ceil<std::chrono::milliseconds>(context->deadline() - std::chrono::system_clock::now());
  const auto capped = [&](uint32_t timeoutMs) {
    return static_cast<uint32_t>(std::clamp<int64_t>(clientLeft.count(), 0, timeoutMs));
  };
  if (request.has_get()) request.mutable_get()->set_timeout_ms(capped(request.get().timeout_ms()));
  if (request.has_wait()) request.mutable_wait()->set_timeout_ms(capped(request.wait().timeout_ms()));
  return UnaryCall::start(core_, std::make_shared<UnaryCall>(std::move(fill)), request);
}

// Each unary call is its Session request, translated: the handler runs it, `fill` copies the answer.

grpc::ServerUnaryReactor* StoreService::Set(grpc::CallbackServerContext* context, const v1::SetRequest* request,
                                            v1::SetResponse*) {
  v1::StoreRequest r;
  *r.mutable_set() = *request;
  return unary(context, std::move(r), [](v1::StoreResponse&) {});
}

grpc::ServerUnaryReactor* StoreService::Get(grpc::CallbackServerContext* context, const v1::GetRequest* request,
                                            v1::GetResponse* response) {
  v1::StoreRequest r;
  *r.mutable_get() = *request;
  return unary(context, std::move(r), [response](v1::StoreResponse& a) { response->Swap(a.mutable_get()); });
}

grpc::ServerUnaryReactor* StoreService::Add(grpc::CallbackServerContext* context, const v1::AddRequest* request,
                                            v1::AddResponse* response) {
  v1::StoreRequest r;
  *r.mutable_add() = *request;
  return unary(context, std::move(r), [response](v1::StoreResponse& a) { response->Swap(a.mutable_add()); });
}

grpc::ServerUnaryReactor* StoreService::CompareSet(grpc::CallbackServerContext* context,
                                                   const v1::CompareSetRequest* request,
                                                   v1::CompareSetResponse* response) {
  v1::StoreRequest r;
  *r.mutable_compare_set() = *request;
  return unary(context, std::move(r), [response](v1::StoreResponse& a) { response->Swap(a.mutable_compare_set()); });
}

grpc::ServerUnaryReactor* StoreService::Wait(grpc::CallbackServerContext* context, const v1::WaitRequest* request,
                                             v1::WaitResponse*) {
  v1::StoreRequest r;
  *r.mutable_wait() = *request;
  return unary(context, std::move(r), [](v1::StoreResponse&) {});
}

grpc::ServerUnaryReactor* StoreService::Check(grpc::CallbackServerContext* context, const v1::CheckRequest* request,
                                              v1::CheckResponse* response) {
  v1::StoreRequest r;
  *r.mutable_check() = *request;
  return unary(context, std::move(r), [response](v1::StoreResponse& a) { response->Swap(a.mutable_check()); });
}

grpc::ServerUnaryReactor* StoreService::Delete(grpc::CallbackServerContext* context, const v1::DeleteRequest* request,
                                               v1::DeleteResponse* response) {
  v1::StoreRequest r;
  *r.mutable_delete_key() = *request;
  return unary(context, std::move(r), [response](v1::StoreResponse& a) { response->Swap(a.mutable_delete_key()); });
}

grpc::ServerUnaryReactor* StoreService::NumKeys(grpc::CallbackServerContext* context,
                                                const v1::NumKeysRequest* request, v1::NumKeysResponse* response) {
  v1::StoreRequest r;
  *r.mutable_num_keys() = *request;
  return unary(context, std::move(r), [response](v1::StoreResponse& a) { response->Swap(a.mutable_num_keys()); });
}

}  // namespace ddprun
