// Client of ddprun's key-value store, as c10d's TCPStore and gloo's Store: bytes in, bytes out;
// get and wait block up to a timeout. Every call stays inside one job's run id and round, so keys
// of another round are invisible. The worker SDK includes this header, so it names no gRPC type.
//
// Every call goes over one long-lived connection per client, reopened after it breaks: in the
// store's own framing (store_wire.h) where the server speaks it and no TLS is asked for, else the
// store's gRPC Session stream. DDPRUN_STORE_TRANSPORT=grpc in the environment (or `transport`)
// forces the Session stream. Thread-safe: one client may serve many threads, whose calls pipeline on the stream.
// Every call has a deadline of its timeout plus a margin. Errors are exceptions from
// common/error.h: TimeoutError (the message names the missing keys, or the call whose deadline
// passed), ConnectionError (unreachable, shut down, the stream broke under the call, or "invalid
// job token"), StateError (a stale round, or add() on a value that is not a number), ConfigError
// (an empty or oversized key or value).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tls/tls_options.h"

namespace ddprun::v1 {
class StoreRequest;
class StoreResponse;
}  // namespace ddprun::v1

namespace ddprun {

struct StoreClientOptions {
  std::string address;  // host:port of the store service
  std::string token;    // the job token; empty when the job has none
  std::string runId;
  uint64_t round = 0;
  // How long get() and wait() wait for keys; every other call gets it as its deadline too.
  std::chrono::milliseconds timeout{300000};
  // How long the constructor keeps retrying to connect.
  std::chrono::milliseconds connectTimeout{10000};
  // A worker's store connection sits idle for hours between its bootstrap and its last barrier.
  // After this long without traffic the client pings the server; a connection that died without
  // a word (a host gone, a firewall or load balancer that dropped it) then fails the calls on it
  // within about twice this, instead of at their deadlines. 0: no pings.
  std::chrono::milliseconds keepalive{30000};
  // TLS to the store (the rendezvous server's port): DDPRUN_STORE_TLS* for workers.
  TlsClientOptions tls{};
  // kAuto: the store's own framing when the server speaks it and TLS is off (unless
  // DDPRUN_STORE_TRANSPORT=grpc), else the gRPC Session stream. kGrpc: always the Session stream.
  enum class Transport { kAuto, kGrpc } transport = Transport::kAuto;
};

class StoreClient {
 public:
  // Connects, retrying with jittered exponential backoff; ConnectionError after connectTimeout.
  explicit StoreClient(StoreClientOptions options);
  ~StoreClient();
  StoreClient(StoreClient&&) noexcept;
  StoreClient& operator=(StoreClient&&) noexcept;
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  void set(const std::string& key, const std::string& value);
  // Waits up to the timeout for the key to exist, then returns its value.
  std::string get(const std::string& key);
  // Adds delta to the counter under key (missing counts as 0); returns the new value.
  int64_t add(const std::string& key, int64_t delta);
  // Sets desired when the key holds expected (or is missing and expected is empty); returns the
  // value after the call, empty when the key is missing.
  std::string compareSet(const std::string& key, const std::string& expected,
                         const std::string& desired);
  // Waits until every key exists: up to the options' timeout, or the given one.
  void wait(const std::vector<std::string>& keys);
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  // Whether every key exists now; does not wait.
  bool check(const std::vector<std::string>& keys);
  // True when the key existed.
  bool deleteKey(const std::string& key);
  // Keys in this run and round.
  int64_t numKeys();

  // The raw call, for a proxy (store/forward/) that carries other clients' requests: sends
  // `request` as it is (its op's scope is the caller's to set, not the options'; its id is set
  // here, the transport's) with a deadline of `wait` plus the margin every call has, and returns
  // the response. Throws nothing for what the store or the connection answers: a failure is the
  // response's status (a grpc::StatusCode number), DEADLINE_EXCEEDED at the deadline, UNAVAILABLE
  // with the message when reconnecting failed. The keys and values are not validated here: the
  // store validates them.
  v1::StoreResponse call(v1::StoreRequest& request, std::chrono::milliseconds wait);

  const StoreClientOptions& options() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun
