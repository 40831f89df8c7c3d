// One etcd watch (a Watch stream) over a key range, that survives the loss of the member it is on:
// a reader thread reconnects to the next member and resumes from the revision after the last event
// it delivered, so no event is lost or repeated across a failover (docs/etcd.md).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "etcd/kv.pb.h"

namespace grpc {
class ClientContext;
}

namespace ddprun {

class EtcdClient;

// The revision a watch was to start or resume from was compacted away (a cluster that compacts,
// as Kubernetes' does every 5 minutes, while the watch moved to another member): what changed in
// between is lost to it. Its users read the range again and watch from that read.
class EtcdCompacted : public StateError {
 public:
  using StateError::StateError;
};

class EtcdWatch {
 public:
  // afterRevision for a watch of every change from the moment etcd creates it.
  static constexpr int64_t kFromNow = -1;

  // Watches [key, rangeEnd) (rangeEnd empty: the key alone) for every change after revision
  // `afterRevision` (the revision a read answered at, so that nothing between the read and the
  // watch is missed), or, with kFromNow, after the revision at which etcd created it
  // (startedAfter()). Prefer kFromNow then a read at startedAfter() on a latency path: etcd 3.4
  // serves a watch whose start revision is already behind (a write landed between the read and
  // the watch) from a catch-up loop that runs every 100 ms, while a watch from now gets each event
  // as it commits. The client must outlive the watch.
  EtcdWatch(EtcdClient& client, std::string key, std::string rangeEnd, int64_t afterRevision);
  ~EtcdWatch();
  EtcdWatch(const EtcdWatch&) = delete;
  EtcdWatch& operator=(const EtcdWatch&) = delete;

  // The events that arrived, waiting for at least one until deadline (empty at the deadline).
  // ConnectionError when no member could carry the watch for the client's retryTimeout;
  // EtcdCompacted when the revision was compacted away.
  std::vector<mvccpb::Event> next(std::chrono::steady_clock::time_point deadline);

  // The revision this watch delivers every change after: afterRevision, or for kFromNow the
  // store's revision when etcd created the watch; nullopt while it is not created yet at
  // deadline. ConnectionError as next().
  std::optional<int64_t> startedAfter(std::chrono::steady_clock::time_point deadline);

 private:
  void run();
  bool streamOnce(std::size_t endpoint);  // true when the watch was created before it ended

  EtcdClient& client_;
  const std::string key_;
  const std::string rangeEnd_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<mvccpb::Event> events_;
  std::exception_ptr error_;
  bool stopping_ = false;
  int64_t nextRevision_;                  // where a reconnected stream resumes; 0: from now
  int64_t startedAfter_ = 0;              // 0 until known (kFromNow: until created)
  grpc::ClientContext* context_ = nullptr;  // the running stream's, for cancelling it
  std::thread reader_;
};

}  // namespace ddprun
