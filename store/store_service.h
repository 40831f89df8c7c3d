// The Store gRPC service: the workers' key-value store, served from a RunScopedStore. Get and Wait
// never block a gRPC thread: they register an asynchronous wait and finish their reactor from
// its callback, from client cancellation, or from the service's timer thread at their deadline.
// Session streams (store_session.h) carry the same operations, many per stream.
//
// Owner's duties: register it on a grpc::ServerBuilder (with applyServerDefaults), call
// shutdown() before grpc::Server::Shutdown() so that pending waits end at once instead of holding
// the server's shutdown, and destroy the server before the service.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/log_limiter.h"
#include "ddprun/v1/store.grpc.pb.h"
#include "store/run_scoped_store.h"

namespace ddprun {

struct StoreServiceOptions {
  // Job token every call must carry in "x-ddprun-token"; empty: no token needed.
  std::string token;
  // Whether a request's round may use the store. Unset: every round may (standalone use).
  std::function<bool(const std::string& runId, uint64_t round)> roundIsCurrent;
  // Whether the server has a job of that id at all, so that a call for an unknown job hears so,
  // not "stale round". Unset: every job is known.
  std::function<bool(const std::string& runId)> jobExists;
  // Get/Wait requests one Session stream may have waiting at once; more are refused with
  // RESOURCE_EXHAUSTED, so that one client cannot grow the server's memory without limit.
  std::size_t maxPendingPerSession = 1024;
  // Asked first for every call: may the call's connection go on (ConnectionListener::admitCall)?
  // When it may not, the call ends at once with RESOURCE_EXHAUSTED. Unset: every call may.
  std::function<bool(const std::string& grpcPeer, bool authenticated)> admitCall;
};

class StoreSession;

class StoreService final : public v1::Store::CallbackService {
 public:
  explicit StoreService(StoreServiceOptions options, RunScopedStoreOptions storeOptions = {});
  ~StoreService() override;
  StoreService(const StoreService&) = delete;
  StoreService& operator=(const StoreService&) = delete;

  // The store behind the service, for its owner: drop rounds that are over, runs that ended.
  RunScopedStore& store() { return store_; }

  // Whether `token` is the job token (any is, when the service has none): for connections that
  // carry it once, in their own framing (store_wire_server.h). Constant time.
  bool acceptsToken(std::string_view token) const;

  // Fails pending Get/Wait calls and every later call with UNAVAILABLE, ends every Session stream
  // (UNAVAILABLE), and stops the timer thread. Idempotent; the destructor calls it.
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

 private:
  // A session reaches the store, the options and the timer through its service, and leaves the
  // registry that shutdown() ends sessions from.
  friend class StoreSession;
  friend class StoreRequestHandler;

  struct WaitCall;  // one Get or Wait in flight (store_service.cc)

  // The checks every call and stream passes first (the job token, then the connection's call
  // limits: StoreServiceOptions::admitCall); OK or the status to finish with.
  grpc::Status checkCaller(grpc::CallbackServerContext* context) const;
  grpc::Status tokenStatus(grpc::CallbackServerContext* context) const;
  // Token and round checks every unary call passes first.
  grpc::Status admit(grpc::CallbackServerContext* context, const v1::Scope& scope) const;
  // Runs `body` for a call that completes at once and finishes the call with its outcome.
  grpc::ServerUnaryReactor* unary(grpc::CallbackServerContext* context, const v1::Scope& scope,
                                  const std::function<void()>& body);
  // Fills the response of a Get or Wait once every key exists; nullopt when a key vanished again
  // before it could be read, and the call must wait on.
  using OnSatisfied = std::function<std::optional<grpc::Status>()>;
  // Starts a Get or Wait that ends when every key exists, at its timeout, or on cancellation.
  grpc::ServerUnaryReactor* blocking(grpc::CallbackServerContext* context, const v1::Scope& scope,
                                     std::vector<std::string> keys, uint32_t timeoutMs,
                                     OnSatisfied onSatisfied);
  // Tells the timer thread of a new wait's deadline; wakes it only when it would sleep past it.
  void wakeTimer(RunScopedStore::TimePoint deadline);
  void timerLoop();
  void removeSession(StoreSession* session);

  const StoreServiceOptions options_;
  // One line per 10 s for refused calls: a client that retries must not flood the log.
  mutable LogLimiter refusalLog_;
  RunScopedStore store_;
  std::mutex timerMutex_;
  std::condition_variable timerCv_;
  uint64_t timerGeneration_ = 0;  // bumped by a wait due before timerTarget_
  // When the timer thread wakes next; min() while it reads the store's next deadline, so that
  // every wait added meanwhile wakes it.
  RunScopedStore::TimePoint timerTarget_ = RunScopedStore::TimePoint::min();
  bool stopping_ = false;
  std::thread timer_;
  std::mutex sessionsMutex_;
  std::unordered_map<StoreSession*, std::weak_ptr<StoreSession>> sessions_;
  bool sessionsClosed_ = false;  // set by shutdown(): new sessions are refused
};

}  // namespace ddprun
