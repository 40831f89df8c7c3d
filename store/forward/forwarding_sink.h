// The agent's side of the workers' store: its loopback TCPStore adapter hands each connection's
// requests to a sink made here, which sends them on to the job's store (on the rendezvous server)
// through one StoreClient that every sink shares (thread-safe; its calls pipeline on one
// connection). The adapter cannot tell it from a StoreRequestHandler (store_request_sink.h).
//
// Order: each sink runs its connection's requests one at a time, in the order they came, on a
// thread of its own, so its answers come in request order (what a TCPStore client expects) and
// one connection's blocking wait never holds up another's. The thread starts at the sink's first
// request (a connection that never sends anything costs none) and ends with the sink; the
// forwarder joins finished threads when it starts the next one, and all of them in stop().
//
// Waits: a wait cannot be cancelled on the remote store, so a Get or Wait longer than waitSlice
// goes out in slices of waitSlice, sent again while a slice times out, until its own timeout has
// passed; it is then answered with the store's timeout status, naming its whole timeout. end() (a
// CANCEL_WAIT, a closed connection) and stop() therefore take effect within one slice.
//
// Errors: the store's and the connection's come back as the response's status, as the store would
// answer them; a connection that cannot be reopened is UNAVAILABLE. More than maxQueuedPerSink
// requests waiting on one sink: the excess is answered RESOURCE_EXHAUSTED at once (ahead of the
// ones queued: the adapter closes the connection on an error anyway).
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "store/client/store_client.h"
#include "store/core/store_request_sink.h"

namespace ddprun {

struct StoreForwarderOptions {
  // The job's store: address, token, connect timeout, keepalive, TLS. Its runId and round are
  // unused: every forwarded request carries its own scope. Its timeout is the deadline of every
  // request that is not a Get or Wait (plus the client's margin).
  StoreClientOptions client;
  // Another way to the job's store (etcd's: store/forward/etcd_forwarding.h): runs one request
  // within `timeout` and answers it as the store would, errors as statuses; called on the sinks'
  // threads, several at once. Unset: a StoreClient made from `client`.
  std::function<v1::StoreResponse(v1::StoreRequest& request, std::chrono::milliseconds timeout)> call;
  // The store as errors name it; empty: client.address.
  std::string name;
  // The longest single wait sent to the store; bounds how long end() and stop() take to act.
  std::chrono::milliseconds waitSlice{1000};
  // Requests one sink holds before its thread takes them; beyond: RESOURCE_EXHAUSTED.
  std::size_t maxQueuedPerSink = 1024;
};

class StoreForwarder {
 public:
  // Connects to the job's store; throws as StoreClient's constructor does (ConnectionError when
  // it is not reachable within connectTimeout). A wrong token does not throw here: every call
  // is then answered UNAUTHENTICATED.
  explicit StoreForwarder(StoreForwarderOptions options);
  // stop().
  ~StoreForwarder();
  StoreForwarder(const StoreForwarder&) = delete;
  StoreForwarder& operator=(const StoreForwarder&) = delete;

  // The sink of one new connection, answering through `respond`. A sink made after stop()
  // answers every request UNAVAILABLE at once.
  std::shared_ptr<StoreRequestSink> makeSink(StoreRequestSink::Respond respond);
  // makeSink() as an adapter's factory; it may outlive the forwarder (its sinks then answer
  // UNAVAILABLE).
  StoreRequestSink::Factory factory();

  // Ends every sink (no answer comes from them afterwards) and joins every thread: returns after
  // the calls in flight, at most about one waitSlice, or a call's deadline when the store stopped
  // answering. Idempotent; a concurrent call returns when the first one is done.
  void stop();

 private:
  struct Shared;
  class Sink;
  std::shared_ptr<Shared> shared_;
};

}  // namespace ddprun
