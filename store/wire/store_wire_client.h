// The client side of the store's own framing (store_wire.h), for StoreClient (internal).
//
// One TCP connection carries every call; callers on many threads pipeline requests, each with its
// own id. Writes go out under a mutex; one waiting caller at a time reads and hands each answer to
// the caller it belongs to, as the Session client does, so a single-threaded client reads its own
// answer with no thread hand-off.
//
// Deadlines: a call that passes its deadline fails with DEADLINE_EXCEEDED and its late answer is
// dropped; the connection stays. Keepalive: a caller that has waited `keepalive` without a byte
// from the server sends a ping; when nothing comes within as long again, the connection is taken
// for dead and its calls fail with UNAVAILABLE (a host gone, a firewall that forgot it), not at
// their deadlines. A broken connection fails its calls; the next call reconnects (jittered
// backoff within connectTimeout). A request whose write failed before any byte of it left is sent
// again, once, on the new connection.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "ddprun/v1/store.pb.h"

namespace ddprun::detail {

struct StoreWireClientOptions {
  std::string address;  // host:port
  std::string token;    // empty: none
  std::chrono::milliseconds connectTimeout{10000};
  std::chrono::milliseconds keepalive{30000};  // 0: no pings
};

class StoreWireClient {
 public:
  using Clock = std::chrono::steady_clock;

  enum class Opened { kWire, kNotWire };
  // Connects and says hello, retrying within connectTimeout. kNotWire: the server answered, but
  // not in this framing (a server without it, or one at its connection limit that refused in
  // HTTP/2): the caller uses the Session stream instead. Throws ConnectionError when no server
  // answers in time.
  explicit StoreWireClient(StoreWireClientOptions options);
  ~StoreWireClient();
  StoreWireClient(const StoreWireClient&) = delete;
  StoreWireClient& operator=(const StoreWireClient&) = delete;

  Opened opened() const { return opened_; }

  // Sends `request` (its id is set here) and returns its response. A failure of the connection
  // comes back as a response with that status (DEADLINE_EXCEEDED when `deadline` passed,
  // UNAVAILABLE when it broke, UNAUTHENTICATED when the server refused the token), so the caller
  // maps every error one way. Throws ConnectionError only when reconnecting fails.
  v1::StoreResponse call(v1::StoreRequest& request, Clock::time_point deadline);

 private:
  struct Conn;
  struct Waiter;

  // A new connection that has passed the hello, retrying within connectTimeout; null with
  // opened_ = kNotWire when the server does not speak the framing, or with `refused` set when it
  // refused the token. Throws ConnectionError at the timeout.
  std::shared_ptr<Conn> connect(std::string* refused);
  std::shared_ptr<Conn> current(std::string* refused);
  bool sendFrame(Conn& conn, const std::string& frame, Clock::time_point deadline, bool* nothingSent);
  void await(const std::shared_ptr<Conn>& conn, Waiter& waiter, Clock::time_point deadline);
  // Reads what is there (up to `until`) and hands out whole answers; false when the connection
  // broke (its waiters are failed).
  bool readSome(Conn& conn, Clock::time_point until);
  void fail(Conn& conn, const std::string& why);

  const StoreWireClientOptions options_;
  Opened opened_ = Opened::kWire;
  uint64_t nextId_ = 1;       // under writeMutex_
  std::mutex writeMutex_;     // one writer at a time; guards current_ and reconnecting
  std::shared_ptr<Conn> current_;
  std::mutex mutex_;          // the waiters of every connection, and who reads
};

}  // namespace ddprun::detail
