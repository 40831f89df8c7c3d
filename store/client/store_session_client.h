// The client side of a Store Session stream, for StoreClient (internal: names gRPC types, which
// the public store_client.h must not).
//
// One long-lived stream carries every call; callers on many threads pipeline requests, each with
// its own id. Writes go out under a mutex. Reading needs no thread of its own: one waiting caller
// at a time reads and hands each response to the caller it belongs to, so a single-threaded
// client reads its own answer with no thread hand-off at all.
//
// Deadlines: a stream has none, so a small watchdog thread checks the calls in flight and cancels
// the stream when one's deadline passes (a server that stopped answering); that call fails with
// TimeoutError, the others on the stream with ConnectionError. A stream that breaks fails its
// calls in flight; the next call reconnects (jittered backoff, bounded by connectTimeout) and
// opens a new stream. A request that never left (its write failed on a stream already broken)
// is sent again once on the new stream, so a call after the server restarted works.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "ddprun/v1/store.grpc.pb.h"

namespace ddprun::detail {

struct StoreSessionClientOptions {
  std::string address;  // host:port, for messages
  std::string token;    // sent as metadata when the stream opens; empty: none
  std::chrono::milliseconds connectTimeout{10000};
};

class StoreSessionClient {
 public:
  using Clock = std::chrono::steady_clock;

  // Connects (see connect()); ConnectionError when the server is not reachable in time.
  StoreSessionClient(StoreSessionClientOptions options, std::shared_ptr<grpc::Channel> channel);
  ~StoreSessionClient();
  StoreSessionClient(const StoreSessionClient&) = delete;
  StoreSessionClient& operator=(const StoreSessionClient&) = delete;

  // Sends `request` (its id is set here) and returns its response. A failure of the stream
  // itself comes back as a response with that status (DEADLINE_EXCEEDED when `deadline` passed),
  // so the caller maps every error one way. Throws ConnectionError only when reconnecting fails.
  v1::StoreResponse call(v1::StoreRequest& request, Clock::time_point deadline);

 private:
  struct Stream;
  struct Waiter;

  // Waits for the channel to be READY, sleeping a jittered, doubling delay between attempts so
  // that many workers starting together do not retry in lockstep.
  void connect();
  // The open stream, or a new one (reconnecting first) when the last one broke.
  std::shared_ptr<Stream> stream();
  // Waits for `waiter`'s response, reading for the others while it waits; marks it failed when
  // the stream broke first.
  void await(Stream& stream, Waiter& waiter);
  void watchdogLoop();

  const StoreSessionClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Store::Stub> stub_;
  std::atomic<uint64_t> nextId_{1};

  std::mutex streamMutex_;  // guards current_ and the opening of a new stream
  std::shared_ptr<Stream> current_;

  std::mutex mutex_;  // guards the in-flight state of every stream and the watchdog's flags
  std::condition_variable watchdogCv_;
  bool watchdogIdle_ = false;  // asleep until a call comes; the next call wakes it
  bool watchdogKick_ = false;  // a call wants the watchdog to look again now
  bool stopping_ = false;
  std::thread watchdog_;
};

}  // namespace ddprun::detail
