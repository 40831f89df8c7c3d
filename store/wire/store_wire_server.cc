#include "store/wire/store_wire_server.h"

#include <spdlog/spdlog.h>
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
#include "common/event_loop.h"
#include "common/log_limiter.h"
#include "store/core/store_ops.h"
#include "store/core/store_request_handler.h"
#include "store/core/store_core.h"
#include "store/core/store_limits.h"
#include "store/wire/store_wire.h"

namespace ddprun {

namespace {

using Clock = std::chrono::steady_clock;

// Read per wake-up and connection, so that one busy client cannot starve the others.
constexpr std::size_t kReadChunk = 64 * 1024;
// Read at once by a connection without a reserved frame once half the bound is held: what such
// a connection may keep while it waits for its turn (a whole frame is processed at once).
constexpr std::size_t kTightReadChunk = 4 * 1024;
constexpr int kReadsPerWakeup = 4;

}  // namespace

class StoreWireServer::Impl : public std::enable_shared_from_this<Impl> {
 public:
  Impl(StoreCore& core, StoreWireServerOptions options) : core_(core), options_(std::move(options)) {}

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
    s.heldBytes = inputHeld_.load(std::memory_order_relaxed) + queued_.load(std::memory_order_relaxed);
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
    // The server's thread only: the memory bound (StoreWireServerOptions::maxHeldBytes).
    std::size_t charged = 0;   // counted in inputHeld_: the reserved frame, or what the reader holds
    std::size_t reserved = 0;  // the partial frame's reservation (its whole size); 0: none
    bool held = false;         // waits in held_ for the bound: not read, no request run
    Clock::time_point reservedAt;  // when the partial frame got its reservation
    Clock::time_point lastRead;    // the last byte read
    Clock::time_point lastWrite;   // under mu_: the last byte written, or since answers waited
  };

  struct Adopted {
    UniqueFd fd;
    std::string address;
  };

  void wakeLoop() { loop_.wake(); }

  void run() {
    threadId_ = std::this_thread::get_id();
    while (true) {
      const auto until = deadlines_.empty() ? Clock::time_point::max() : deadlines_.front().first;
      const auto events = loop_.wait(until);
      wakeups_.fetch_add(1, std::memory_order_relaxed);
      for (const epoll_event& e : events) serve(e.data.u64, e.events);
      {
        std::lock_guard lock(mu_);
        if (stopping_) return;
      }
      takeInbox();
      flushDirty();
      expireHellos();
      releaseHeld();
      runResumed();
      sweepStalled();
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
      raw->lastRead = raw->lastWrite = Clock::now();
      loop_.add(raw->fd.get(), raw->id, EPOLLIN | EPOLLRDHUP);
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
      // At the bound only reserved frames are read: they fit, and their completion frees memory.
      if (!gone && conn->reserved == 0 && atBound()) {
        if (events & (EPOLLHUP | EPOLLERR)) {
          markBroken(*conn);  // reported at every wait until closed: a held one must go now
          closeConn(id);
          return;
        }
        hold(*conn);
        return;
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
    // Into the thread's buffer: a connection keeps only what no whole frame took, so an idle one
    // costs no buffer.
    const bool tight = conn.reserved == 0 && heldBytes() >= options_.maxHeldBytes / 2;
    const std::size_t chunk = conn.state != State::kOpen || tight ? kTightReadChunk : kReadChunk;
    for (int i = 0; i < kReadsPerWakeup; ++i) {
      const ssize_t n = ::recv(conn.fd.get(), scratch_.data(), chunk, MSG_DONTWAIT);
      if (n > 0) {
        conn.reader.append(scratch_.data(), static_cast<std::size_t>(n));
        conn.lastRead = Clock::now();
        if (static_cast<std::size_t>(n) < chunk) break;
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

  // Runs the frames buffered; false when the connection must close. Then counts what the
  // connection holds, and reserves its partial frame's size (or makes it wait for its turn).
  bool runFrames(Conn& conn) {
    const bool ok = runBuffered(conn);
    if (ok) charge(conn);
    return ok;
  }

  bool runBuffered(Conn& conn) {
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
      if (conn.held) return true;
      // At the bound no request runs (its answer could be a largest value): it waits its turn.
      if (conn.state == State::kOpen && conn.reader.pendingFrameBytes() > 0 &&
          conn.reader.buffered() >= conn.reader.pendingFrameBytes() && atBound()) {
        hold(conn);
        return true;
      }
      const auto next = conn.reader.next(payload);
      if (next == storewire::FrameReader::Next::kNeedMore) return true;
      if (next == storewire::FrameReader::Next::kFrame && conn.reserved > 0) {  // it arrived whole
        conn.reserved = 0;
        --reservations_;
      }
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
    conn.lastWrite = Clock::now();
    if (!core_.acceptsToken(hello.token())) {
      core_.logRefusedToken("a connection from " + conn.address);
      detail::setStatus(answer, {StoreCode::kUnauthenticated, "invalid job token"});
      storewire::appendFrame(out, answer);
      std::lock_guard lock(mu_);
      ++stats_.refusedToken;
      conn.out += out;
      queued_.fetch_add(out.size(), std::memory_order_relaxed);
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
    queued_.fetch_add(out.size(), std::memory_order_relaxed);
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
      const std::size_t before = conn.out.size();
      if (conn.out.size() == conn.outSent) conn.lastWrite = Clock::now();  // waits from now
      storewire::appendFrame(conn.out, response);
      queued_.fetch_add(conn.out.size() - before, std::memory_order_relaxed);
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
        queued_.fetch_sub(static_cast<std::size_t>(n), std::memory_order_relaxed);
        conn.lastWrite = Clock::now();
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
    const uint32_t want = (conn.readPaused || conn.held || conn.closeWhenSent || conn.readsDone ? 0u : static_cast<uint32_t>(EPOLLIN | EPOLLRDHUP)) |
                          (conn.wantWrite ? static_cast<uint32_t>(EPOLLOUT) : 0u);
    if (want == conn.watched) return;
    conn.watched = want;
    loop_.modify(conn.fd.get(), conn.id, want);
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
    {
      std::lock_guard lock(mu_);
      queued_.fetch_sub(conn->out.size() - conn->outSent, std::memory_order_relaxed);
    }
    inputHeld_.fetch_sub(conn->charged, std::memory_order_relaxed);
    if (conn->reserved > 0) --reservations_;
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

  // What the connections hold now, together.
  std::size_t heldBytes() const {
    return inputHeld_.load(std::memory_order_relaxed) + queued_.load(std::memory_order_relaxed);
  }
  bool atBound() const { return heldBytes() >= options_.maxHeldBytes; }

  // Counts what the connection holds: its partial frame's reservation, or the bytes its reader
  // holds. A partial frame whose header is here gets a reservation of its whole size when it fits,
  // or when no other frame has one (one frame always fits: the server never waits on itself);
  // else the connection waits, unread, for its turn.
  void charge(Conn& conn) {
    conn.reader.compact();
    if (conn.reserved == 0 && !conn.held && isPartial(conn) && !tryReserve(conn)) hold(conn);
    const std::size_t now = std::max(conn.reserved, conn.reader.held());
    if (now >= conn.charged) {
      inputHeld_.fetch_add(now - conn.charged, std::memory_order_relaxed);
    } else {
      inputHeld_.fetch_sub(conn.charged - now, std::memory_order_relaxed);
    }
    conn.charged = now;
  }

  static bool isPartial(const Conn& conn) {
    return conn.reader.pendingFrameBytes() > conn.reader.buffered();
  }

  bool tryReserve(Conn& conn) {
    const std::size_t frame = conn.reader.pendingFrameBytes();
    const std::size_t others = heldBytes() - conn.charged;
    if (reservations_ > 0 && others + frame > options_.maxHeldBytes) return false;
    conn.reserved = frame;
    conn.reservedAt = Clock::now();
    ++reservations_;
    return true;
  }

  void hold(Conn& conn) {
    if (conn.held) return;
    conn.held = true;
    held_.push_back(conn.id);
    std::lock_guard lock(mu_);
    ++stats_.heldForMemory;
    watchLocked(conn);
  }

  // Lets the held connections go on, in the order they came, while they fit: a partial frame
  // once its reservation fits, the others once below the bound.
  void releaseHeld() {
    while (!held_.empty()) {
      Conn* conn = find(held_.front());
      if (!conn || !conn->held) {
        held_.pop_front();
        continue;
      }
      if (isPartial(*conn) && conn->reserved == 0) {
        if (!tryReserve(*conn)) break;
      } else if (atBound()) {
        break;
      }
      held_.pop_front();
      conn->held = false;
      conn->lastRead = Clock::now();  // the wait was the server's, not the client's
      charge(*conn);
      std::lock_guard lock(mu_);
      watchLocked(*conn);
      resumed_.push_back(conn->id);  // frames it holds run now
    }
  }

  // Closes, once a second, the connections that hold memory without moving it: a reserved frame
  // that got no byte for stallTimeout or is not whole after frameTimeout, answers that saw no byte
  // written for stallTimeout.
  void sweepStalled() {
    const auto now = Clock::now();
    if (now - lastSweep_ < std::chrono::seconds(1)) return;
    lastSweep_ = now;
    std::vector<std::pair<uint64_t, std::string>> stalled;
    for (auto& [id, c] : conns_) {
      Conn& conn = *c;
      std::lock_guard lock(mu_);
      if (conn.closeWhenSent || conn.broken) continue;
      if (conn.reserved > 0 && !conn.held && !conn.readPaused && now - conn.lastRead >= options_.stallTimeout) {
        stalled.emplace_back(id, fmt::format("its frame of {} bytes got no byte for {} ms", conn.reserved,
                                             options_.stallTimeout.count()));
      } else if (conn.reserved > 0 && !conn.held && now - conn.reservedAt >= options_.frameTimeout) {
        stalled.emplace_back(id, fmt::format("its frame of {} bytes was not whole after {} ms", conn.reserved,
                                             options_.frameTimeout.count()));
      } else if (conn.out.size() > conn.outSent && now - conn.lastWrite >= options_.stallTimeout) {
        stalled.emplace_back(id, fmt::format("it read none of its {} bytes of answers for {} ms",
                                             conn.out.size() - conn.outSent, options_.stallTimeout.count()));
      }
    }
    for (auto& [id, why] : stalled) {
      Conn* conn = find(id);
      if (!conn) continue;
      {
        std::lock_guard lock(mu_);
        ++stats_.closedStalled;
      }
      if (auto held = brokenLog_.allow()) {
        spdlog::info("store: closed a connection from {}: {}{}", conn->address, why, heldBackNote(*held));
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
  EventLoop loop_;
  std::vector<char> scratch_ = std::vector<char>(kReadChunk);  // the server's thread: every read lands here first
  // The memory bound: what connections hold, together (StoreWireServerOptions::maxHeldBytes).
  std::atomic<std::size_t> inputHeld_{0};  // partial frames (their reservations), written by the server's thread
  std::atomic<std::size_t> queued_{0};     // answers not yet written, under mu_
  std::size_t reservations_ = 0;           // frames with a reservation (the server's thread)
  std::deque<uint64_t> held_;              // connections waiting for the bound, in arrival order
  Clock::time_point lastSweep_{};
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
