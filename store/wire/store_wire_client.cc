#include "store/wire/store_wire_client.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <thread>
#include <unordered_map>

#include "common/backoff.h"
#include "common/connect.h"
#include "common/error.h"
#include "common/net.h"
#include "common/unique_fd.h"
#include "store/wire/store_wire.h"

namespace ddprun::detail {

namespace {

using std::chrono::milliseconds;

constexpr milliseconds kFirstBackoff{20};
constexpr milliseconds kMaxBackoff{1000};
constexpr int32_t kUnavailable = 14;       // grpc::StatusCode::UNAVAILABLE
constexpr int32_t kDeadlineExceeded = 4;   // grpc::StatusCode::DEADLINE_EXCEEDED
constexpr int32_t kUnauthenticated = 16;   // grpc::StatusCode::UNAUTHENTICATED
constexpr uint64_t kPingId = 0;            // no call has it: its answer is dropped
constexpr std::size_t kReadChunk = 64 * 1024;

int msUntil(StoreWireClient::Clock::time_point t) {
  const auto left = std::chrono::ceil<milliseconds>(t - StoreWireClient::Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
}

v1::StoreResponse failed(uint64_t id, int32_t code, const std::string& why) {
  v1::StoreResponse response;
  response.set_id(id);
  response.mutable_status()->set_code(code);
  response.mutable_status()->set_message(why);
  return response;
}

// Sends all of `data` on a socket, waiting for room up to `deadline`; false on an error or at the
// deadline. `sent` says how much left.
bool sendAll(int fd, std::string_view data, StoreWireClient::Clock::time_point deadline, std::size_t* sent,
             std::string* why) {
  *sent = 0;
  while (*sent < data.size()) {
    const ssize_t n = ::send(fd, data.data() + *sent, data.size() - *sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      *sent += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, msUntil(deadline)) <= 0) {
        *why = "the store did not take the request before its deadline";
        return false;
      }
      continue;
    }
    *why = std::string("writing to the store failed: ") + std::strerror(errno);
    return false;
  }
  return true;
}

}  // namespace

struct StoreWireClient::Waiter {
  uint64_t id = 0;
  bool done = false;
  v1::StoreResponse response;
};

struct StoreWireClient::Conn {
  UniqueFd fd;
  storewire::FrameReader reader{storewire::kMaxFrameBytes};  // the reader's only
  // Under StoreWireClient::mutex_:
  std::unordered_map<uint64_t, Waiter*> waiters;
  bool reading = false;
  bool broken = false;
  std::condition_variable cv;
  Clock::time_point lastReceived = Clock::now();
  bool pingOut = false;
};

StoreWireClient::StoreWireClient(StoreWireClientOptions options) : options_(std::move(options)) {
  std::string refused;
  current_ = connect(&refused);
  // A refused token is a connection that works: its calls say so, as on the Session stream.
}

StoreWireClient::~StoreWireClient() = default;

std::shared_ptr<StoreWireClient::Conn> StoreWireClient::connect(std::string* refused) {
  const bool first = !current_ && nextId_ == 1;
  const auto deadline = Clock::now() + options_.connectTimeout;
  const auto [host, port] = parseEndpoint(options_.address, 0);
  Backoff backoff(kFirstBackoff, kMaxBackoff);
  std::string why = "no address";
  std::string hello(storewire::kMagic);
  {
    v1::StoreHello h;
    h.set_token(options_.token);
    h.set_client("ddprun-store-client/1");  // also makes the opening longer than an HTTP/2 preface
    storewire::appendFrame(hello, h);
  }
  while (true) {
    // One address that accepts a connection per attempt (each at most a second), then its hello;
    // a break ends the attempt.
    Connected c = connectWithin(host, port, deadline, std::chrono::seconds(1));
    do {
      if (!c.fd) {
        why = c.why;
        break;
      }
      UniqueFd fd = std::move(c.fd);
      int one = 1;
      ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      ::setsockopt(fd.get(), SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
      std::size_t sent = 0;
      if (!sendAll(fd.get(), hello, deadline, &sent, &why)) break;
      // The answer: the magic and a frame, or anything else from a server that does not speak it.
      auto conn = std::make_shared<Conn>();
      conn->reader.setMaxFrameBytes(storewire::kMaxHelloBytes);
      bool magicSeen = false;
      bool other = false;  // another protocol answered
      while (true) {
        const std::string_view have = conn->reader.peek();
        if (!magicSeen) {
          const std::size_t n = std::min(have.size(), storewire::kMagic.size());
          if (have.substr(0, n) != storewire::kMagic.substr(0, n)) {
            other = true;
            break;
          }
          if (n == storewire::kMagic.size()) {
            conn->reader.take(n);
            magicSeen = true;
            continue;
          }
        } else {
          std::string_view payload;
          const auto next = conn->reader.next(payload);
          v1::StoreResponse answer;
          if (next == storewire::FrameReader::Next::kTooLarge ||
              (next == storewire::FrameReader::Next::kFrame &&
               !answer.ParseFromArray(payload.data(), static_cast<int>(payload.size())))) {
            other = true;
            break;
          }
          if (next == storewire::FrameReader::Next::kFrame) {
            if (answer.status().code() == kUnauthenticated) {
              *refused = answer.status().message();
              return nullptr;
            }
            if (answer.status().code() != 0) {
              why = answer.status().message();
              break;
            }
            conn->reader.setMaxFrameBytes(storewire::kMaxFrameBytes);
            conn->fd = std::move(fd);
            return conn;
          }
        }
        pollfd r{fd.get(), POLLIN, 0};
        if (::poll(&r, 1, msUntil(deadline)) <= 0) {
          why = "no answer to the store's hello";
          break;
        }
        const ssize_t n = ::recv(fd.get(), conn->reader.room(4096), 4096, MSG_DONTWAIT);
        if (n > 0) {
          conn->reader.appended(static_cast<std::size_t>(n));
          continue;
        }
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        // Closed or reset before any answer: what a server that does not know the magic does
        // (or one restarting, when this is a reconnect).
        why = n == 0 ? "the server closed the connection" : std::strerror(errno);
        other = conn->reader.buffered() == 0 && !magicSeen && first;
        break;
      }
      if (other) {
        // Some other protocol (HTTP/2: a gRPC server without the framing, or a refusal at the
        // connection limit), or a close without a word from one that does not know the magic.
        if (first) {
          opened_ = Opened::kNotWire;
          return nullptr;
        }
        why = "the server does not speak the store's framing";
      }
    } while (false);
    if (Clock::now() >= deadline) {
      throw ConnectionError("cannot connect to the store at " + options_.address + " within " +
                            std::to_string(options_.connectTimeout.count()) + " ms: " + why);
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff.next(), deadline - Clock::now()));
  }
}

std::shared_ptr<StoreWireClient::Conn> StoreWireClient::current(std::string* refused) {
  if (current_) {
    std::lock_guard lock(mutex_);
    if (!current_->broken && !current_->reading) {
      // Idle: a server that restarted meanwhile closed it; find out now, not from the call.
      char byte;
      const ssize_t n = ::recv(current_->fd.get(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        current_->broken = true;
      }
    }
    if (!current_->broken) return current_;
  }
  current_ = connect(refused);
  return current_;
}

void StoreWireClient::fail(Conn& conn, const std::string& why) {
  std::lock_guard lock(mutex_);
  if (conn.broken && conn.waiters.empty()) return;
  conn.broken = true;
  for (auto& [id, waiter] : conn.waiters) {
    waiter->response = failed(id, kUnavailable, why);
    waiter->done = true;
  }
  conn.waiters.clear();
  ::shutdown(conn.fd.get(), SHUT_RDWR);  // wakes a reader in poll
  conn.cv.notify_all();
}

bool StoreWireClient::sendFrame(Conn& conn, const std::string& frame, Clock::time_point deadline, bool* nothingSent) {
  std::size_t sent = 0;
  std::string why;
  const bool ok = sendAll(conn.fd.get(), frame, deadline, &sent, &why);
  *nothingSent = sent == 0;
  if (!ok) fail(conn, why);
  return ok;
}

v1::StoreResponse StoreWireClient::call(v1::StoreRequest& request, Clock::time_point deadline) {
  Waiter waiter;
  std::shared_ptr<Conn> conn;
  {
    std::lock_guard write(writeMutex_);
    std::string frame;
    for (int attempt = 0;; ++attempt) {
      std::string refused;
      conn = current(&refused);
      if (!conn) {
        if (!refused.empty()) return failed(request.id(), kUnauthenticated, refused);
        return failed(request.id(), kUnavailable, "the store at " + options_.address + " does not speak its framing");
      }
      if (frame.empty()) {
        waiter.id = nextId_++;
        request.set_id(waiter.id);
        storewire::appendFrame(frame, request);
      }
      {
        std::lock_guard lock(mutex_);
        if (conn->broken) continue;  // broke since: reconnect
        waiter.done = false;
        conn->waiters[waiter.id] = &waiter;
      }
      bool nothingSent = false;
      if (sendFrame(*conn, frame, deadline, &nothingSent)) break;
      // The connection was dead before this request: send it once more on a new one.
      if (!(nothingSent && attempt == 0 && Clock::now() < deadline)) break;
      std::lock_guard lock(mutex_);
      conn->waiters.erase(waiter.id);
    }
  }
  await(conn, waiter, deadline);
  return std::move(waiter.response);
}

void StoreWireClient::await(const std::shared_ptr<Conn>& conn, Waiter& waiter, Clock::time_point deadline) {
  std::unique_lock lock(mutex_);
  while (!waiter.done) {
    const auto now = Clock::now();
    if (now >= deadline) {
      conn->waiters.erase(waiter.id);  // its late answer is dropped
      waiter.response = failed(waiter.id, kDeadlineExceeded,
                               "no answer from the store at " + options_.address + " before the call's deadline");
      waiter.done = true;
      break;
    }
    if (!conn->reading) {
      conn->reading = true;
      lock.unlock();
      readSome(*conn, deadline);
      lock.lock();
      conn->reading = false;
      conn->cv.notify_all();  // another caller reads on if its answer is still to come
    } else {
      conn->cv.wait_until(lock, deadline);
    }
  }
}

bool StoreWireClient::readSome(Conn& conn, Clock::time_point until) {
  const auto now = Clock::now();
  const bool keepalive = options_.keepalive.count() > 0;
  Clock::time_point wake = until;
  bool pingDue = false, dead = false;
  {
    std::lock_guard lock(mutex_);
    if (conn.broken) return false;
    if (keepalive) {
      const auto silent = now - conn.lastReceived;
      if (conn.pingOut && silent >= 2 * options_.keepalive) dead = true;
      if (!conn.pingOut && silent >= options_.keepalive) {
        pingDue = true;
        conn.pingOut = true;
      }
      wake = std::min(wake, conn.lastReceived + (conn.pingOut || pingDue ? 2 : 1) * options_.keepalive);
    }
  }
  if (dead) {
    fail(conn, "the store at " + options_.address + " stopped answering (no answer to a ping within " +
                   std::to_string(options_.keepalive.count()) + " ms)");
    return false;
  }
  if (pingDue) {
    v1::StoreRequest ping;
    ping.set_id(kPingId);
    ping.mutable_ping();
    std::string frame;
    storewire::appendFrame(frame, ping);
    std::lock_guard write(writeMutex_);
    bool nothingSent = false;
    if (!sendFrame(conn, frame, now + options_.keepalive, &nothingSent)) return false;
  }
  pollfd p{conn.fd.get(), POLLIN, 0};
  const int ready = ::poll(&p, 1, msUntil(wake));
  if (ready <= 0) return true;  // the caller looks at its deadline and the keepalive again
  bool received = false;
  while (true) {
    const ssize_t n = ::recv(conn.fd.get(), conn.reader.room(kReadChunk), kReadChunk, MSG_DONTWAIT);
    if (n > 0) {
      conn.reader.appended(static_cast<std::size_t>(n));
      received = true;
      if (static_cast<std::size_t>(n) < kReadChunk) break;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    fail(conn, n == 0 ? "the store at " + options_.address + " closed the connection"
                      : "the connection to the store at " + options_.address + " broke: " + std::strerror(errno));
    return false;
  }
  std::string_view payload;
  bool unreadable = false;
  {
    std::lock_guard lock(mutex_);
    if (received) {
      conn.lastReceived = Clock::now();
      conn.pingOut = false;
    }
    while (true) {
      const auto next = conn.reader.next(payload);
      if (next == storewire::FrameReader::Next::kNeedMore) break;
      v1::StoreResponse response;
      if (next == storewire::FrameReader::Next::kTooLarge ||
          !response.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
        unreadable = true;
        break;
      }
      auto it = conn.waiters.find(response.id());
      if (it == conn.waiters.end()) continue;  // a ping's, or a call that gave up
      it->second->response = std::move(response);
      it->second->done = true;
      conn.waiters.erase(it);
    }
    conn.cv.notify_all();
  }
  if (unreadable) {
    fail(conn, "the store at " + options_.address + " sent an unreadable answer");
    return false;
  }
  return true;
}

}  // namespace ddprun::detail
