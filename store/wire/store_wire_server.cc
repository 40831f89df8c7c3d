#include "store/wire/store_wire_server.h"

#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/error.h"
#include "common/log_limiter.h"
#include "store/core/store_ops.h"
#include "store/core/store_request_handler.h"
#include "store/core/store_core.h"
#include "store/core/store_limits.h"
#include "store/wire/store_wire.h"

namespace ddprun {

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kWakeKey = 0;  // connection ids start at 1
// Read per wake-up and connection, so that one busy client cannot starve the others.
constexpr std::size_t kReadChunk = 64 * 1024;
constexpr int kReadsPerWakeup = 4;

}  // namespace

class StoreWireServer::Impl : public std::enable_shared_from_this<Impl> {
 public:
  Impl(StoreCore& core, StoreWireServerOptions options) : core_(core), options_(std::move(options)) {
    epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
    if (!epoll_) throw DDPRUN_SYSTEM_ERROR("epoll_create1");
    wake_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!wake_) throw DDPRUN_SYSTEM_ERROR("eventfd");
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kWakeKey;
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_.get(), &ev);
  }

  void start() { thread_ = std::thread([this] { run(); }); }

  void adopt(UniqueFd fd, std::string address) {
    {
      std::lock_guard lock(mu_);
      if (stopping_) return;  // closes it
      inbox_.push_back({std::move(fd), std::move(address)});
      ++stats_.accepted;
    }
    wakeLoop();
  }

  void stop() {
    {
      std::lock_guard lock(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    wakeLoop();
    if (thread_.joinable()) thread_.join();
    std::vector<std::shared_ptr<StoreRequestHandler>> handlers;
    {
      std::lock_guard lock(mu_);
      for (auto& [id, conn] : conns_) {
        if (conn->handler) handlers.push_back(conn->handler);
      }
      conns_.clear();  // closes them
      inbox_.clear();
    }
    for (auto& h : handlers) h->end();
  }

  StoreWireServerStats stats() const {
    std::lock_guard lock(mu_);
    StoreWireServerStats s = stats_;
    s.open = conns_.size();
    s.wakeups = wakeups_.load(std::memory_order_relaxed);
    return s;
  }

 private:
  enum class State { kMagic, kHello, kOpen };

  struct Conn {
    uint64_t id = 0;
    UniqueFd fd;
    std::string address;
    // The server's thread only.
    State state = State::kMagic;
    storewire::FrameReader reader{storewire::kMaxHelloBytes};
    std::shared_ptr<StoreRequestHandler> handler;
    // Under mu_: answers not yet written, and how the connection is watched.
    std::string out;
    std::size_t outSent = 0;
    bool dirty = false;       // in dirty_: has answers to write
    bool wantWrite = false;   // EPOLLOUT: the socket was full
    uint32_t watched = EPOLLIN | EPOLLRDHUP;  // the events epoll watches for it now
    bool readPaused = false;  // too much waits to be written
    bool readsDone = false;   // the client half-closed: close once every answer is out
    uint64_t requests = 0;    // run through the handler; each gets exactly one answer
    uint64_t answers = 0;     // of them, answered
    bool closeWhenSent = false;
    bool broken = false;      // a write failed: the client is gone
  };

  struct Adopted {
    UniqueFd fd;
    std::string address;
  };

  void wakeLoop() {
    const uint64_t one = 1;
    (void)!::write(wake_.get(), &one, sizeof(one));
  }

  void run() {
    threadId_ = std::this_thread::get_id();
    std::vector<epoll_event> events(256);
    while (true) {
      int timeout = 1000;
      if (!deadlines_.empty()) {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadlines_.front().first - Clock::now()).count();
        timeout = static_cast<int>(std::clamp<int64_t>(left, 0, 1000));
      }
      const int n = ::epoll_wait(epoll_.get(), events.data(), static_cast<int>(events.size()), timeout);
      if (n < 0 && errno != EINTR) break;
      wakeups_.fetch_add(1, std::memory_order_relaxed);
      for (int i = 0; i < n; ++i) {
        const uint64_t key = events[i].data.u64;
        if (key == kWakeKey) {
          uint64_t count = 0;
          (void)!::read(wake_.get(), &count, sizeof(count));
          continue;
        }
        serve(key, events[i].events);
      }
      {
        std::lock_guard lock(mu_);
        if (stopping_) return;
      }
      takeInbox();
      flushDirty();
      expireHellos();
      runResumed();
    }
  }

  void takeInbox() {
    std::deque<Adopted> adopted;
    {
      std::lock_guard lock(mu_);
      adopted.swap(inbox_);
    }
    for (auto& a : adopted) {
      auto conn = std::make_unique<Conn>();
      conn->id = nextId_++;
      conn->fd = std::move(a.fd);
      conn->address = std::move(a.address);
      Conn* raw = conn.get();
      {
        std::lock_guard lock(mu_);
        conns_.emplace(raw->id, std::move(conn));
      }
      deadlines_.emplace_back(Clock::now() + options_.helloTimeout, raw->id);
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLRDHUP;
      ev.data.u64 = raw->id;
      ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, raw->fd.get(), &ev);
      serve(raw->id, EPOLLIN);  // its magic may be here already: the front door saw it
    }
  }

  Conn* find(uint64_t id) {
    // Only this thread adds or removes connections, so it may look without the lock.
    auto it = conns_.find(id);
    return it == conns_.end() ? nullptr : it->second.get();
  }

  void serve(uint64_t id, uint32_t events) {
    Conn* conn = find(id);
    if (!conn) return;
    if (events & EPOLLOUT) {
      std::lock_guard lock(mu_);
      flushLocked(*conn);
    }
    if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
      bool gone = false;
      {
        std::lock_guard lock(mu_);
        if (conn->readPaused && !(events & (EPOLLHUP | EPOLLERR))) return;
        // Half-closed before, and now hung up or failed: the client is gone entirely.
        gone = conn->readsDone && (events & (EPOLLHUP | EPOLLERR));
        if (gone) conn->broken = true;
      }
      if (!gone) readFrom(*conn);
    }
    bool close = false;
    {
      std::lock_guard lock(mu_);
      close = conn->broken || (conn->closeWhenSent && conn->outSent == conn->out.size());
    }
    if (close) closeConn(id);
  }

  // Reads what the connection sent and runs its whole frames. At the client's end of sending, what
  // it sent is still answered (its waits too); the connection closes once nothing is owed.
  void readFrom(Conn& conn) {
    bool eof = false, error = false;
    for (int i = 0; i < kReadsPerWakeup; ++i) {
      char* at = conn.reader.room(kReadChunk);
      const ssize_t n = ::recv(conn.fd.get(), at, kReadChunk, MSG_DONTWAIT);
      if (n > 0) {
        conn.reader.appended(static_cast<std::size_t>(n));
        if (static_cast<std::size_t>(n) < kReadChunk) break;
        continue;
      }
      if (n < 0 && (errno == EINTR)) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      (n == 0 ? eof : error) = true;
      break;
    }
    if (!runFrames(conn) || error) {
      markBroken(conn);
      return;
    }
    if (eof) {
      // Nothing more to read (watchLocked stops watching for it).
      std::lock_guard lock(mu_);
      conn.readsDone = true;
      watchLocked(conn);
      closeIfDoneLocked(conn);
    }
  }

  // Runs the frames buffered; false when the connection must close.
  bool runFrames(Conn& conn) {
    if (conn.state == State::kMagic) {
      if (conn.reader.buffered() < storewire::kMagic.size()) return true;
      if (conn.reader.take(storewire::kMagic.size()) != storewire::kMagic) {
        return abuse(conn, "it sent bytes that are not the store's framing");
      }
      conn.state = State::kHello;
    }
    std::string_view payload;
    while (true) {
      {
        std::lock_guard lock(mu_);
        if (conn.closeWhenSent || conn.broken) return true;
        if (conn.readPaused) return true;  // the rest stays buffered until the client reads
      }
      const auto next = conn.reader.next(payload);
      if (next == storewire::FrameReader::Next::kNeedMore) return true;
      if (next == storewire::FrameReader::Next::kTooLarge) {
        return abuse(conn, conn.state == State::kHello ? "its hello is larger than any client's"
                                                       : "it sent a frame over the store's message limit");
      }
      if (conn.state == State::kHello) {
        if (!hello(conn, payload)) return false;
        continue;
      }
      if (!request_.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
        return abuse(conn, "it sent a frame that is no store request");
      }
      {
        std::lock_guard lock(mu_);
        ++conn.requests;
      }
      conn.handler->handle(request_);
    }
  }

  bool hello(Conn& conn, std::string_view payload) {
    v1::StoreHello hello;
    if (!hello.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
      return abuse(conn, "it sent a hello that is no StoreHello");
    }
    v1::StoreResponse answer;
    answer.set_id(0);
    std::string out(storewire::kMagic);
    if (!core_.acceptsToken(hello.token())) {
      core_.logRefusedToken("a connection from " + conn.address);
      detail::setStatus(answer, {StoreCode::kUnauthenticated, "invalid job token"});
      storewire::appendFrame(out, answer);
      std::lock_guard lock(mu_);
      ++stats_.refusedToken;
      conn.out += out;
      conn.closeWhenSent = true;
      flushLocked(conn);
      return true;
    }
    storewire::appendFrame(out, answer);
    conn.state = State::kOpen;
    conn.reader.setMaxFrameBytes(storewire::kMaxFrameBytes);
    std::weak_ptr<Impl> weak = shared_from_this();
    const uint64_t id = conn.id;
    conn.handler = std::make_shared<StoreRequestHandler>(core_, [weak, id](v1::StoreResponse&& response) {
      if (auto self = weak.lock()) self->deliver(id, response);
    });
    std::lock_guard lock(mu_);
    conn.out += out;
    markDirtyLocked(conn);
    return true;
  }

  bool abuse(Conn& conn, const std::string& why) {
    {
      std::lock_guard lock(mu_);
      ++stats_.closedBroken;
    }
    if (options_.onAbuse) {
      options_.onAbuse(conn.address, why);  // which says so
    } else if (auto held = brokenLog_.allow()) {
      spdlog::warn("store: closed a connection from {}: {}{}", conn.address, why, heldBackNote(*held));
    }
    return false;
  }

  // An answer, from any thread: queued for this thread to write.
  void deliver(uint64_t id, const v1::StoreResponse& response) {
    bool wake = false;
    {
      std::lock_guard lock(mu_);
      auto it = conns_.find(id);
      if (it == conns_.end()) return;
      Conn& conn = *it->second;
      if (conn.broken || conn.closeWhenSent) return;
      storewire::appendFrame(conn.out, response);
      ++conn.answers;
      closeIfDoneLocked(conn);  // the last answer of a half-closed connection: it goes once written
      if (conn.out.size() - conn.outSent >= kMaxQueuedAnswerBytes && !conn.readPaused) {
        conn.readPaused = true;
        watchLocked(conn);  // epoll_ctl is safe from any thread
      }
      if (!conn.dirty) {
        markDirtyLocked(conn);
        wake = std::this_thread::get_id() != threadId_ && !wakePending_;
        if (wake) wakePending_ = true;
      }
    }
    if (wake) wakeLoop();
  }

  // A half-closed connection closes once every request it sent is answered and written: no frame
  // waits to run (a partial one never completes), every request run has its answer (counted where
  // the answer is queued, so none is in flight), and then nothing is left to send.
  void closeIfDoneLocked(Conn& conn) {
    if (conn.readsDone && !conn.closeWhenSent && !conn.readPaused && conn.answers == conn.requests) {
      conn.closeWhenSent = true;
    }
  }

  void markDirtyLocked(Conn& conn) {
    if (conn.dirty) return;
    conn.dirty = true;
    dirty_.push_back(conn.id);
  }

  void flushDirty() {
    std::vector<uint64_t> close;
    {
      std::lock_guard lock(mu_);
      wakePending_ = false;
      for (uint64_t id : dirty_) {
        auto it = conns_.find(id);
        if (it == conns_.end()) continue;
        Conn& conn = *it->second;
        conn.dirty = false;
        flushLocked(conn);
        if (conn.broken || (conn.closeWhenSent && conn.outSent == conn.out.size())) close.push_back(id);
      }
      dirty_.clear();
    }
    for (uint64_t id : close) closeConn(id);
  }

  // Writes what the socket takes now; watches for room when it is full.
  void flushLocked(Conn& conn) {
    while (conn.outSent < conn.out.size() && !conn.broken) {
      const ssize_t n = ::send(conn.fd.get(), conn.out.data() + conn.outSent, conn.out.size() - conn.outSent,
                               MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        conn.outSent += static_cast<std::size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        break;
      } else {
        conn.broken = true;
      }
    }
    if (conn.outSent == conn.out.size()) {
      conn.out.clear();
      conn.outSent = 0;
    }
    const bool full = conn.outSent < conn.out.size();
    const bool resume = conn.readPaused && conn.out.size() - conn.outSent < kMaxQueuedAnswerBytes / 2;
    if (resume) conn.readPaused = false;
    conn.wantWrite = full;
    watchLocked(conn);
    if (resume) {
      // Frames read while paused wait in the buffer: run them now that there is room.
      resumed_.push_back(conn.id);
    }
  }

  // Watches the connection for what it waits for now: bytes to read unless reading is paused or
  // over, room to write while answers wait. Level-triggered, so a readable socket that is not
  // read must not be watched for reading.
  void watchLocked(Conn& conn) {
    const uint32_t want = (conn.readPaused || conn.closeWhenSent || conn.readsDone ? 0u : static_cast<uint32_t>(EPOLLIN | EPOLLRDHUP)) |
                          (conn.wantWrite ? static_cast<uint32_t>(EPOLLOUT) : 0u);
    if (want == conn.watched) return;
    conn.watched = want;
    epoll_event ev{};
    ev.events = want;
    ev.data.u64 = conn.id;
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, conn.fd.get(), &ev);
  }

  void markBroken(Conn& conn) {
    std::lock_guard lock(mu_);
    conn.broken = true;
  }

  void closeConn(uint64_t id) {
    std::unique_ptr<Conn> conn;
    {
      std::lock_guard lock(mu_);
      auto it = conns_.find(id);
      if (it == conns_.end()) return;
      conn = std::move(it->second);
      conns_.erase(it);
    }
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, conn->fd.get(), nullptr);
    if (conn->handler) conn->handler->end();
    if (conn->closeWhenSent) ::shutdown(conn->fd.get(), SHUT_WR);
  }  // the socket closes here

  void expireHellos() {
    const auto now = Clock::now();
    while (!deadlines_.empty() && deadlines_.front().first <= now) {
      const uint64_t id = deadlines_.front().second;
      deadlines_.pop_front();
      Conn* conn = find(id);
      if (!conn || conn->state == State::kOpen) continue;
      {
        std::lock_guard lock(mu_);
        if (conn->closeWhenSent) continue;  // refused already; goes when its answer is out
        ++stats_.closedBroken;
      }
      if (auto held = brokenLog_.allow()) {
        spdlog::info("store: closed a connection from {}: no hello within {} ms{}", conn->address,
                     options_.helloTimeout.count(), heldBackNote(*held));
      }
      closeConn(id);
    }
  }

  // Connections whose reading resumed: their buffered frames run now.
  void runResumed() {
    std::vector<uint64_t> resumed;
    {
      std::lock_guard lock(mu_);
      resumed.swap(resumed_);
    }
    for (uint64_t id : resumed) {
      if (Conn* conn = find(id)) {
        if (!runFrames(*conn)) markBroken(*conn);
        bool close = false;
        {
          std::lock_guard lock(mu_);
          closeIfDoneLocked(*conn);
          close = conn->broken || (conn->closeWhenSent && conn->outSent == conn->out.size());
        }
        if (close) closeConn(id);
      }
    }
  }

  StoreCore& core_;
  const StoreWireServerOptions options_;
  UniqueFd epoll_;
  UniqueFd wake_;
  std::thread thread_;
  std::thread::id threadId_;
  v1::StoreRequest request_;  // the server's thread only: reused for every request
  uint64_t nextId_ = 1;       // the server's thread only
  std::atomic<uint64_t> wakeups_{0};
  std::deque<std::pair<Clock::time_point, uint64_t>> deadlines_;  // hellos, in arrival order
  LogLimiter brokenLog_;

  mutable std::mutex mu_;
  bool stopping_ = false;
  bool wakePending_ = false;
  std::deque<Adopted> inbox_;
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns_;  // changed by the server's thread only
  std::vector<uint64_t> dirty_;
  std::vector<uint64_t> resumed_;
  StoreWireServerStats stats_;
};

StoreWireServer::StoreWireServer(StoreCore& core, StoreWireServerOptions options)
    : impl_(std::make_shared<Impl>(core, std::move(options))) {
  impl_->start();
}
StoreWireServer::~StoreWireServer() { stop(); }
void StoreWireServer::adopt(UniqueFd fd, std::string address) { impl_->adopt(std::move(fd), std::move(address)); }
void StoreWireServer::stop() { impl_->stop(); }
StoreWireServerStats StoreWireServer::stats() const { return impl_->stats(); }

}  // namespace ddprun
