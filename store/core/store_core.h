// The workers' store without a transport: the run-scoped store, the rules every request passes
// (the job token, the round, the bounds) and the timer that ends waits at their deadlines. Each
// transport is a thin adapter over it that turns its own messages into StoreRequests for a
// StoreRequestHandler (store_request_handler.h): the gRPC Session stream and unary calls
// (store/grpc/), the store's own framing (store/wire/). No gRPC type appears here.
//
// A transport whose protocol has no credential or scope of its own binds both once per connection
// (checkToken when it opens, the scope written into each request it makes); one with no error
// reply closes the connection where the handler answers with an error.
//
// Owner's duties: construct it first and destroy it last; call shutdown() before stopping the
// adapters, so that every pending wait ends (UNAVAILABLE) instead of holding their shutdown.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/log_limiter.h"
#include "store/core/run_scoped_store.h"
#include "store/core/store_status.h"

namespace ddprun {

struct StoreCoreOptions {
  // Job token every connection or call must show; empty: no token needed.
  std::string token;
  // Whether a request's round may use the store. Unset: every round may (standalone use).
  std::function<bool(const std::string& runId, uint64_t round)> roundIsCurrent;
  // Whether the server has a job of that id at all, so that a call for an unknown job hears so,
  // not "stale round". Unset: every job is known.
  std::function<bool(const std::string& runId)> jobExists;
  // Gets and waits one connection (a Session stream, a framed connection, one unary call) may have
  // waiting at once; more are refused with RESOURCE_EXHAUSTED, so that one client cannot grow the
  // server's memory without limit.
  std::size_t maxPendingPerConnection = 1024;
  // What the store may hold.
  RunScopedStoreOptions limits;
  // Whether the core's timer thread ends waits at their deadlines. False: the owner calls
  // store().expire() itself (a test or fuzz harness with a clock of its own).
  bool driveDeadlines = true;
};

class StoreCore {
 public:
  explicit StoreCore(StoreCoreOptions options);
  ~StoreCore();  // shutdown()
  StoreCore(const StoreCore&) = delete;
  StoreCore& operator=(const StoreCore&) = delete;

  // The store itself, for its owner (drop rounds that are over, runs that ended) and the handler.
  RunScopedStore& store() { return store_; }
  const RunScopedStore& store() const { return store_; }
  const StoreCoreOptions& options() const { return options_; }

  // Whether `token` is the job token (any is, when there is none), compared in constant time.
  bool acceptsToken(std::string_view token) const;
  // Logs a refusal for a wrong or missing token (rate-limited, never the token itself); `who`
  // names the client ("a call from ipv4:...", "a connection from ...").
  void logRefusedToken(std::string_view who) const;

  // OK when `scope` may use the store now; INVALID_ARGUMENT for a bad run id, FAILED_PRECONDITION
  // for an unknown job or a round that is not the current one.
  StoreStatus roundStatus(const StoreScope& scope) const;

  // Why a wait ended without its keys: the store closed, the round ended, or its timeout; nullopt
  // when the keys exist after all (they arrived just as the deadline passed).
  std::optional<StoreStatus> waitFailure(const StoreScope& scope, const std::vector<std::string>& keys,
                                         uint32_t timeoutMs) const;

  // Tells the timer of a new wait's deadline; wakes it only when it would sleep past it.
  void wakeTimer(RunScopedStore::TimePoint deadline);

  // Closes the store (every pending wait fails, every later operation is refused with UNAVAILABLE)
  // and stops the timer. Idempotent.
  void shutdown();

 private:
  void timerLoop();

  const StoreCoreOptions options_;
  // One line per 10 s for refused tokens: a client that retries must not flood the log.
  mutable LogLimiter refusalLog_;
  RunScopedStore store_;
  std::mutex timerMutex_;
  std::condition_variable timerCv_;
  uint64_t timerGeneration_ = 0;  // bumped by a wait due before timerTarget_
  // When the timer wakes next; min() while it reads the store's next deadline, so that every wait
  // added meanwhile wakes it.
  RunScopedStore::TimePoint timerTarget_ = RunScopedStore::TimePoint::min();
  bool stopping_ = false;
  std::thread timer_;
};

}  // namespace ddprun
