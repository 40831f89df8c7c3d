// A small synchronous client of etcd's v3 gRPC API (proto/etcd/), for the etcd rendezvous backend
// and the workers' store on etcd (docs/etcd.md). Thread-safe; one channel per endpoint.
//
// Failover: every call has a deadline (callTimeout per attempt). An attempt that fails with
// UNAVAILABLE (member down, connection reset, "leader changed", "no leader") or misses its deadline
// (a frozen member accepts connections and never answers) is tried again on the next endpoint after
// a jittered backoff, until retryTimeout has passed; then ConnectionError. A mutation retried this
// way may have been applied once already (the answer was lost): put and delete are idempotent, a
// compare-and-swap is safe when the caller re-reads on failure; EtcdStore::add adds a nonce to make
// it exact (worker_sdk/etcd_store.cc).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/error.h"
#include "etcd/rpc.grpc.pb.h"

namespace ddprun {

// A member answered that it does not serve etcd's v3 API (UNIMPLEMENTED): the endpoint names
// some other gRPC server (a ddprun-rdzv, for one). A configuration error: no retry mends it.
class NotEtcdError : public ConfigError {
 public:
  NotEtcdError(std::string endpoint, std::string detail, const std::string& what)
      : ConfigError(what), endpoint_(std::move(endpoint)), detail_(std::move(detail)) {}
  const std::string& endpoint() const { return endpoint_; }
  const std::string& detail() const { return detail_; }  // gRPC's message ("unknown service ...")

 private:
  std::string endpoint_;
  std::string detail_;
};

struct EtcdClientOptions {
  std::vector<std::string> endpoints;  // host:port of each member (a scheme prefix is accepted)
  // TLS (torch's etcd rdzv_conf protocol=https, cacert, cert, key): PEM files.
  bool tls = false;
  std::string caCertFile;
  std::string certFile;
  std::string keyFile;
  // etcd's own users (auth enabled): read from a token file by the caller, never from argv.
  std::string user;
  std::string password;
  std::chrono::milliseconds callTimeout{std::chrono::seconds(5)};    // one attempt
  std::chrono::milliseconds retryTimeout{std::chrono::seconds(30)};  // all attempts of one call
  // Bounds on one message each way. etcd's server refuses requests over its own
  // --max-request-bytes (1.5 MiB by default) with "request is too large".
  int maxMessageBytes = 16 * 1024 * 1024;
  // The member a client starts on: -1 picks one at random, so that many clients spread over the
  // cluster; tests pin it to reach a given member first.
  int firstEndpoint = -1;
  // A watch silent for this long asks its member for progress, and moves to another member when
  // no answer comes within as long again (a frozen member; EtcdWatch). 0: only gRPC keepalive.
  std::chrono::milliseconds watchProbe{std::chrono::seconds(1)};
};

struct EtcdKeyValue {
  std::string key;
  std::string value;
  int64_t createRevision = 0;
  int64_t modRevision = 0;
  int64_t version = 0;
  int64_t lease = 0;
};

// The first key after every key that starts with prefix (etcd's range_end for a prefix).
std::string etcdPrefixEnd(const std::string& prefix);

// Splits "h1:2379,http://h2:2379" into host:port endpoints (schemes dropped, 2379 when no port).
std::vector<std::string> parseEtcdEndpoints(const std::string& text);

class EtcdClient {
 public:
  // Connects lazily; authenticates at once when a user is set (ConnectionError, or ConfigError
  // for refused credentials).
  explicit EtcdClient(EtcdClientOptions options);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  const EtcdClientOptions& options() const { return options_; }

  std::optional<EtcdKeyValue> get(const std::string& key, int64_t* revision = nullptr);
  // Every key under prefix, by key; revision gets the store's revision the answer is at.
  // atRevision > 0: the keys as they were at that revision (an error once it is compacted).
  std::vector<EtcdKeyValue> getPrefix(const std::string& prefix, int64_t* revision = nullptr, int64_t atRevision = 0);
  int64_t countPrefix(const std::string& prefix);
  // Returns the revision of the put.
  int64_t put(const std::string& key, const std::string& value, int64_t lease = 0);
  // Returns how many keys were deleted.
  int64_t deleteKey(const std::string& key);
  int64_t deletePrefix(const std::string& prefix);
  etcdserverpb::TxnResponse txn(const etcdserverpb::TxnRequest& request);

  // A lease of ttl seconds (etcd may grant a longer one); returns its id.
  int64_t grantLease(std::chrono::seconds ttl);
  // Revokes it, deleting every key attached; a lease already gone is not an error.
  void revokeLease(int64_t id);
  // Renews it once; returns the remaining TTL in seconds, 0 when the lease is gone (expired).
  int64_t keepAliveOnce(int64_t id);
  // Seconds the lease has left; -1 when it expired or never existed.
  int64_t leaseTimeToLive(int64_t id);

  // The owner stops: every call in flight is cancelled, and it and every later call (of any
  // thread) fail at once with ClosedError instead of retrying for up to retryTimeout. Watches are
  // not affected (they end when their EtcdWatch goes).
  void cancel();

  // Maintenance.Status of one endpoint (by index), no failover: tests find the leader with it.
  etcdserverpb::StatusResponse status(std::size_t endpoint);

  // For EtcdWatch: the stub of the endpoint to use now, and the metadata every call carries.
  std::size_t currentEndpoint() const;
  void markFailed(std::size_t endpoint);
  etcdserverpb::Watch::Stub& watchStub(std::size_t endpoint);
  void prepare(grpc::ClientContext& context);

 private:
  struct Member;
  // Runs attempt(stubs, context) with failover (see top of file); `what` names the call in errors.
  void call(const char* what, const std::function<grpc::Status(Member&, grpc::ClientContext&)>& attempt);
  void authenticate();

  EtcdClientOptions options_;
  std::vector<std::unique_ptr<Member>> members_;
  mutable std::mutex mutex_;
  std::size_t current_ = 0;
  std::string authToken_;
  // cancel(): the calls in flight (guarded by mutex_), and a wake-up for a call between attempts.
  bool cancelled_ = false;
  std::set<grpc::ClientContext*> inFlight_;
  std::condition_variable cancelCv_;
};

// Maps a gRPC failure of an etcd call to ddprun's errors (ConnectionError, TimeoutError,
// StateError), naming the call.
[[noreturn]] void throwEtcdError(const char* what, const grpc::Status& status);

}  // namespace ddprun
