// The store's gRPC adapter: the Store service's unary calls and Session streams, driven over a
// StoreCore (store/core/store_core.h). Each unary call and each Session stream runs its requests
// through a StoreRequestHandler, so a wait lives the same way whatever carries it; this file only
// turns gRPC calls into StoreRequests and answers back. Get and Wait never block a gRPC thread.
//
// Owner's duties: register it on a grpc::ServerBuilder (with applyServerDefaults); call the core's
// shutdown() and then this one's before grpc::Server::Shutdown(), so that pending waits end at once
// instead of holding the server's shutdown; destroy the server before the service, and the service
// before the core.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "ddprun/v1/store.grpc.pb.h"
#include "store/core/store_core.h"

namespace ddprun {

struct StoreServiceOptions {
  // Asked first for every call: may the call's connection go on (ConnectionListener::admitCall)?
  // When it may not, the call ends at once with RESOURCE_EXHAUSTED. Unset: every call may.
  std::function<bool(const std::string& grpcPeer, bool authenticated)> admitCall;
};

class StoreSession;

class StoreService final : public v1::Store::CallbackService {
 public:
  // `core` must outlive the service.
  explicit StoreService(StoreCore& core, StoreServiceOptions options = {});
  ~StoreService() override;
  StoreService(const StoreService&) = delete;
  StoreService& operator=(const StoreService&) = delete;

  StoreCore& core() { return core_; }

  // Ends every Session stream (UNAVAILABLE) and refuses later ones. Idempotent; the destructor
  // calls it. Pending waits end through the core's shutdown().
  void shutdown();

  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* context, const v1::SetRequest* request,
                                v1::SetResponse* response) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* context, const v1::GetRequest* request,
                                v1::GetResponse* response) override;
  grpc::ServerUnaryReactor* Add(grpc::CallbackServerContext* context, const v1::AddRequest* request,
                                v1::AddResponse* response) override;
  grpc::ServerUnaryReactor* CompareSet(grpc::CallbackServerContext* context,
                                       const v1::CompareSetRequest* request,
                                       v1::CompareSetResponse* response) override;
  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext* context, const v1::WaitRequest* request,
                                 v1::WaitResponse* response) override;
  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* context,
                                  const v1::CheckRequest* request,
                                  v1::CheckResponse* response) override;
  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext* context,
                                   const v1::DeleteRequest* request,
                                   v1::DeleteResponse* response) override;
  grpc::ServerUnaryReactor* NumKeys(grpc::CallbackServerContext* context,
                                    const v1::NumKeysRequest* request,
                                    v1::NumKeysResponse* response) override;
  grpc::ServerBidiReactor<v1::StoreRequest, v1::StoreResponse>* Session(
      grpc::CallbackServerContext* context) override;

  // For a session as it ends: it leaves the registry shutdown() ends sessions from.
  void removeSession(StoreSession* session);

 private:
  class UnaryCall;  // one unary call, over a StoreRequestHandler of its own (store_service.cc)

  // The checks every call and stream passes first (the job token, then the connection's call
  // limits: StoreServiceOptions::admitCall); OK or the status to finish with.
  grpc::Status checkCaller(grpc::CallbackServerContext* context) const;
  // Runs `request` (a unary call's, translated) and finishes the call with its answer, which
  // `fill` copies into the call's response when it is OK.
  grpc::ServerUnaryReactor* unary(grpc::CallbackServerContext* context, v1::StoreRequest request,
                                  std::function<void(v1::StoreResponse&)> fill);

  StoreCore& core_;
  const StoreServiceOptions options_;
  std::mutex sessionsMutex_;
  std::unordered_map<StoreSession*, std::weak_ptr<StoreSession>> sessions_;
  bool sessionsClosed_ = false;  // set by shutdown(): new sessions are refused
};

}  // namespace ddprun
