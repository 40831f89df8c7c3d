#include "store/tcpstore/tcpstore_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <deque>
#include <limits>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/error.h"
#include "common/event_loop.h"
#include "common/log_limiter.h"
#include "common/strings.h"
#include "store/core/store_core.h"
#include "store/core/store_limits.h"
#include "store/core/store_request_handler.h"
#include "store/tcpstore/tcpstore_codec.h"
#include "store/tcpstore/tcpstore_requests.h"

namespace ddprun {

namespace {

using Clock = std::chrono::steady_clock;
using tcpstore::Dialect;
using tcpstore::Op;

constexpr std::size_t kReadChunk = 64 * 1024;
constexpr int kReadsPerWakeup = 4;
// Requests of one connection whose answers are not back yet. A torch client waits for each answer
// (only a wait and its CANCEL_WAIT overlap); a client that pipelines more is held, unread, here,
// so that a sink that answers later (store/forward/) holds no unbounded queue.
constexpr std::size_t kMaxOwedPerConnection = 64;

using tcpstore::Owed;

}  // namespace

class TcpStoreServer::Impl : public std::enable_shared_from_this<Impl> {
 public:
  explicit Impl(TcpStoreServerOptions options) : options_(std::move(options)) {
    DDPRUN_CHECK(options_.bind != nullptr, "TcpStoreServerOptions::bind is required");
    DDPRUN_CHECK(options_.makeSink != nullptr, "TcpStoreServerOptions::makeSink is required");
  }

  void start() { thread_ = std::thread([this] { run(); }); }

  void adopt(UniqueFd fd) {
    auto info = describe(fd.get());
    if (!info.unixSocket && !info.address.empty()) {
      // Answers are small and each is awaited: none may sit in Nagle's buffer for an ACK.
      const int one = 1;
      ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    info.fd = fd.get();
    const auto scope = options_.bind(info);
    std::lock_guard lock(mu_);
    if (stopping_) return;
    if (!scope || admitted_ >= options_.maxConnections) {
      ++stats_.refused;
      return;  // closes it
    }
    ++stats_.accepted;
    ++admitted_;
    inbox_.push_back({std::move(fd), info.address, *scope});
    loop_.wake();
  }

  void stop() {
    {
      std::lock_guard lock(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    loop_.wake();
    if (thread_.joinable()) thread_.join();
    std::vector<std::shared_ptr<StoreRequestSink>> handlers;
    std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns;
    {
      std::lock_guard lock(mu_);
      for (auto& [id, conn] : conns_) handlers.push_back(conn->handler);
      conns.swap(conns_);
      inbox_.clear();
    }
    for (auto& h : handlers) h->end();
  }

  TcpStoreServerStats stats() const {
    std::lock_guard lock(mu_);
    TcpStoreServerStats s = stats_;
    s.open = conns_.size();
    s.heldBytes = heldBytes();
    return s;
  }

 private:
  struct Conn {
    uint64_t id = 0;
    UniqueFd fd;
    std::string address;
    StoreScope scope;
    // The server's thread only.
    Dialect dialect = Dialect::kUnknown;
    std::string in;          // bytes read and not yet a whole command
    std::size_t reserved = 0;  // the partial command's reservation; 0: none
    std::size_t charged = 0;   // counted in inputHeld_
    bool held = false;         // waits in held_ for the memory bound
    Clock::time_point partialSince;  // the first byte of the partial command
    Clock::time_point lastRead;
    // Under mu_; replaced by the server's thread only, which reads it without the lock.
    std::shared_ptr<StoreRequestSink> handler;
    bool answersNow = false;  // handler->answersNow(): the server's thread only
    uint64_t generation = 0;  // the handler's: bumped by CANCEL_WAIT, older answers are dropped
    std::unordered_map<uint64_t, Owed> owed;  // by request id
    uint64_t nextRequest = 1;
    std::string out;
    std::size_t outSent = 0;
    Clock::time_point lastWrite;
    bool dirty = false;
    bool wantWrite = false;
    bool readPaused = false;
    bool owedPaused = false;  // kMaxOwedPerConnection answers are owed: no command runs until some come
    bool closeWhenSent = false;
    bool broken = false;
    uint32_t watched = EPOLLIN | EPOLLRDHUP;
  };

  struct Adopted {
    UniqueFd fd;
    std::string address;
    StoreScope scope;
  };

  void run() {
    threadId_ = std::this_thread::get_id();
    while (true) {
      const auto events = loop_.wait(Clock::time_point::max());
      for (const epoll_event& e : events) serve(e.data.u64, e.events);
      {
        std::lock_guard lock(mu_);
        if (stopping_) return;
      }
      takeInbox();
      flushDirty();
      releaseHeld();
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
      conn->scope = std::move(a.scope);
      conn->lastRead = conn->lastWrite = Clock::now();
      Conn* raw = conn.get();
      raw->handler = makeHandler(raw->id, raw->generation);  // not yet shared: no lock needed
      raw->answersNow = raw->handler->answersNow();
      {
        std::lock_guard lock(mu_);
        conns_.emplace(raw->id, std::move(conn));
      }
      loop_.add(raw->fd.get(), raw->id, EPOLLIN | EPOLLRDHUP);
    }
  }

  // Called with no lock held: makeSink is the owner's code.
  std::shared_ptr<StoreRequestSink> makeHandler(uint64_t id, uint64_t generation) {
    std::weak_ptr<Impl> weak = shared_from_this();
    return options_.makeSink([weak, id, generation](v1::StoreResponse&& response) {
      if (auto self = weak.lock()) self->deliver(id, generation, response);
    });
  }

  Conn* find(uint64_t id) {
    auto it = conns_.find(id);  // only this thread adds or removes connections
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
      bool paused = false;
      {
        std::lock_guard lock(mu_);
        paused = conn->readPaused || conn->owedPaused || conn->closeWhenSent;
      }
      if ((paused || conn->held) && (events & (EPOLLHUP | EPOLLERR))) {
        markBroken(*conn);  // reported at every wait while not read: the client is gone
      } else if (!paused && !conn->held) {
        if (conn->reserved == 0 && atBound() && !(events & (EPOLLHUP | EPOLLERR))) {
          hold(*conn);
        } else {
          readFrom(*conn);
        }
      }
    }
    closeIfDone(id);
  }

  void closeIfDone(uint64_t id) {
    Conn* conn = find(id);
    if (!conn) return;
    bool close = false;
    {
      std::lock_guard lock(mu_);
      close = conn->broken || (conn->closeWhenSent && conn->outSent == conn->out.size());
    }
    if (close) closeConn(id);
  }

  void readFrom(Conn& conn) {
    bool eof = false, error = false;
    for (int i = 0; i < kReadsPerWakeup; ++i) {
      // A partial command reads no further than its reservation (or kUnreservedBytes) allows.
      const std::size_t room = std::max(conn.reserved, kUnreservedBytes);
      if (conn.in.size() >= room) break;
      const std::size_t chunk = std::min(kReadChunk, room - conn.in.size());
      const ssize_t n = ::recv(conn.fd.get(), scratch_.data(), chunk, MSG_DONTWAIT);
      if (n > 0) {
        if (conn.in.empty()) conn.partialSince = Clock::now();
        conn.in.append(scratch_.data(), static_cast<std::size_t>(n));
        conn.lastRead = Clock::now();
        if (static_cast<std::size_t>(n) < chunk) break;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      (n == 0 ? eof : error) = true;
      break;
    }
    if (!runCommands(conn) || error) {
      markBroken(conn);
      return;
    }
    if (eof) {
      // torch's server closes a connection whose client ended: its waits are forgotten, what is
      // already answered is still sent.
      std::shared_ptr<StoreRequestSink> handler;
      {
        std::lock_guard lock(mu_);
        conn.closeWhenSent = true;
        handler = conn.handler;
        watchLocked(conn);
      }
      handler->end();
    }
  }

  // Runs every whole command buffered; false when the connection must close.
  bool runCommands(Conn& conn) {
    std::size_t pos = 0;
    bool ok = true;
    while (ok) {
      {
        std::lock_guard lock(mu_);
        if (conn.readPaused || conn.closeWhenSent || conn.broken) break;
        if (conn.owed.size() >= kMaxOwedPerConnection) {
          conn.owedPaused = true;
          watchLocked(conn);
          break;
        }
      }
      const std::string_view rest(conn.in.data() + pos, conn.in.size() - pos);
      if (conn.dialect == Dialect::kUnknown) {
        const auto r = tcpstore::detectDialect(rest, conn.dialect);
        if (r.kind == tcpstore::ParseResult::Kind::kNeedMore) break;
        pos += r.consumed;
        if (conn.dialect == Dialect::kLegacy) {
          std::lock_guard lock(mu_);
          ++stats_.legacy;
        }
        continue;
      }
      const auto r = tcpstore::parseCommand(rest, conn.dialect, command_);
      if (r.kind == tcpstore::ParseResult::Kind::kBad) {
        ok = abuse(conn, r.why);
        break;
      }
      if (r.kind == tcpstore::ParseResult::Kind::kNeedMore) {
        // Its fields declare more than it may hold now: reserve (again, for a command whose later
        // fields declare more), or wait for room.
        if (r.declared > std::max(conn.reserved, kUnreservedBytes) && !conn.held) {
          const bool first = conn.reserved == 0;
          if (!first) {
            conn.reserved = 0;
            --reservations_;
          }
          if (!tryReserve(conn, r.declared, first)) hold(conn);
        }
        break;
      }
      pos += r.consumed;
      if (conn.reserved > 0) {  // it arrived whole
        conn.reserved = 0;
        --reservations_;
      }
      ok = runCommand(conn);
    }
    conn.in.erase(0, pos);
    if (!conn.in.empty() && pos > 0) conn.partialSince = Clock::now();
    charge(conn);
    return ok;
  }

  // Runs command_ (parsed whole); false when the connection must close.
  bool runCommand(Conn& conn) {
    tcpstore::Command& c = command_;
    switch (c.op) {
      case Op::kValidate:
        return abuse(conn, "VALIDATE after the connection's opening");
      case Op::kPing: {
        std::lock_guard lock(mu_);
        std::string answer;
        tcpstore::appendU32(answer, c.nonce);
        queueLocked(conn, answer);
        return true;
      }
      case Op::kCancelWait:
        cancelWaits(conn);
        return true;
      case Op::kQueuePush:
      case Op::kQueuePop:
      case Op::kQueueLen:
      case Op::kBarrier:
      case Op::kWatchKey:
        return notServed(conn, c.op);
      default:
        break;
    }
    v1::StoreRequest request;
    Owed owed;
    const auto waitMs = static_cast<uint32_t>(
        std::clamp<int64_t>(options_.waitDeadline.count(), 1, std::numeric_limits<uint32_t>::max()));
    tcpstore::toStoreRequest(c, conn.scope, waitMs, request, owed);
    if (conn.answersNow) {
      // A store in this process: answered here, in order, with no hand-over (the handler is
      // replaced on this thread only, so it lives through the call).
      response_.Clear();
      if (conn.handler->answerNow(request, response_)) return answered(conn, owed, response_);
    }
    std::shared_ptr<StoreRequestSink> handler;
    {
      std::lock_guard lock(mu_);
      request.set_id(conn.nextRequest++);
      conn.owed.emplace(request.id(), std::move(owed));
      handler = conn.handler;
    }
    handler->handle(request);  // quick ones answer (deliver) before it returns
    std::lock_guard lock(mu_);
    return !conn.broken;
  }

  // The answer of a request answered on this thread; false when the connection must close.
  bool answered(Conn& conn, const Owed& owed, const v1::StoreResponse& response) {
    const bool failed = response.has_status() && response.status().code() != 0;
    answer_.clear();
    if (!failed) {
      tcpstore::encodeAnswer(owed, response, answer_);
      if (answer_.empty()) return true;  // a set: nothing to write, nothing else changes
    }
    std::string failure;
    {
      std::lock_guard lock(mu_);
      if (conn.broken) return false;
      answerLocked(conn, response, answer_, failure);
    }
    logFailure(failure);
    return failure.empty();
  }

  // CANCEL_WAIT: every wait of the connection ends; answered WAIT_CANCELED after whatever
  // STOP_WAITING was queued before it. Answers of the old handler that come later are dropped.
  void cancelWaits(Conn& conn) {
    std::shared_ptr<StoreRequestSink> old;
    // generation changes on this thread only, so it is read here without the lock.
    auto fresh = makeHandler(conn.id, conn.generation + 1);
    {
      std::lock_guard lock(mu_);
      old = conn.handler;
      ++conn.generation;
      // A torch client has only its wait owed here; anything a client pipelined beside it is
      // dropped with it.
      conn.owed.clear();
      conn.owedPaused = false;
      conn.handler = std::move(fresh);
      conn.answersNow = conn.handler->answersNow();
      std::string answer;
      tcpstore::appendU8(answer, tcpstore::kWaitCanceled);
      queueLocked(conn, answer);
    }
    old->end();
  }

  bool notServed(Conn& conn, Op op) {
    {
      std::lock_guard lock(mu_);
      ++stats_.closedBroken;
    }
    if (auto held = log_.allow()) {
      spdlog::warn("store: closed a TCPStore connection from {}: it sent {}, which ddprun's store does not serve{}",
                   conn.address, tcpstore::opName(op), heldBackNote(*held));
    }
    return false;
  }

  bool abuse(Conn& conn, const std::string& why) {
    {
      std::lock_guard lock(mu_);
      ++stats_.closedBroken;
    }
    if (options_.onAbuse) {
      options_.onAbuse(conn.address, why);
    } else if (auto held = log_.allow()) {
      spdlog::warn("store: closed a TCPStore connection from {}: {}{}", conn.address, printable(why, 200),
                   heldBackNote(*held));
    }
    return false;
  }

  // An answer of the handler, from any thread: written in TCPStore's bytes, or the connection
  // closed for an error.
  void deliver(uint64_t id, uint64_t generation, const v1::StoreResponse& response) {
    std::string failure;
    bool wake = false;
    {
      std::lock_guard lock(mu_);
      auto it = conns_.find(id);
      if (it == conns_.end()) return;
      Conn& conn = *it->second;
      if (conn.generation != generation || conn.broken || conn.closeWhenSent) return;
      auto owedIt = conn.owed.find(response.id());
      if (owedIt == conn.owed.end()) return;
      const Owed owed = std::move(owedIt->second);
      conn.owed.erase(owedIt);
      if (conn.owedPaused && conn.owed.size() < kMaxOwedPerConnection / 2) {
        conn.owedPaused = false;
        resumed_.push_back(conn.id);  // its buffered commands run now
        watchLocked(conn);
      }
      std::string answer;
      if (!(response.has_status() && response.status().code() != 0)) tcpstore::encodeAnswer(owed, response, answer);
      answerLocked(conn, response, answer, failure);
      wake = std::this_thread::get_id() != threadId_;
    }
    logFailure(failure);
    if (wake) loop_.wake();
  }

  // Queues a request's answer (`answer`, its bytes, when it did not fail), or marks the connection
  // broken for a failed one (`failure` says why).
  void answerLocked(Conn& conn, const v1::StoreResponse& response, const std::string& answer, std::string& failure) {
    if (response.has_status() && response.status().code() != 0) {
      conn.broken = true;
      ++stats_.closedFailed;
      failure = conn.address + ": " + response.status().message();
    } else if (!answer.empty()) {
      queueLocked(conn, answer);
    }
    if (!conn.dirty) {
      conn.dirty = true;
      dirty_.push_back(conn.id);
    }
  }

  void logFailure(const std::string& failure) {
    if (failure.empty()) return;
    if (auto held = log_.allow()) {
      spdlog::info("store: closed the TCPStore connection from {}{}", failure, heldBackNote(*held));
    }
  }

  void queueLocked(Conn& conn, const std::string& answer) {
    if (conn.out.size() == conn.outSent) conn.lastWrite = Clock::now();  // waits from now
    conn.out += answer;
    queued_.fetch_add(answer.size(), std::memory_order_relaxed);
    if (conn.out.size() - conn.outSent >= kMaxQueuedAnswerBytes && !conn.readPaused) {
      conn.readPaused = true;
      watchLocked(conn);
    }
    if (!conn.dirty) {
      conn.dirty = true;
      dirty_.push_back(conn.id);
    }
  }

  void flushDirty() {
    std::vector<uint64_t> ids;
    {
      std::lock_guard lock(mu_);
      ids.swap(dirty_);
      for (uint64_t id : ids) {
        auto it = conns_.find(id);
        if (it == conns_.end()) continue;
        it->second->dirty = false;
        flushLocked(*it->second);
      }
    }
    for (uint64_t id : ids) closeIfDone(id);
  }

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
    conn.wantWrite = conn.outSent < conn.out.size();
    if (conn.readPaused && conn.out.size() - conn.outSent < kMaxQueuedAnswerBytes / 2) {
      conn.readPaused = false;
      resumed_.push_back(conn.id);  // its buffered commands run now
    }
    watchLocked(conn);
  }

  void watchLocked(Conn& conn) {
    const bool read = !(conn.readPaused || conn.owedPaused || conn.held || conn.closeWhenSent);
    const uint32_t want = (read ? static_cast<uint32_t>(EPOLLIN | EPOLLRDHUP) : 0u) |
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
    std::shared_ptr<StoreRequestSink> handler;
    {
      std::lock_guard lock(mu_);
      auto it = conns_.find(id);
      if (it == conns_.end()) return;
      conn = std::move(it->second);
      conns_.erase(it);
      --admitted_;
      queued_.fetch_sub(conn->out.size() - conn->outSent, std::memory_order_relaxed);
      handler = conn->handler;
    }
    inputHeld_.fetch_sub(conn->charged, std::memory_order_relaxed);
    if (conn->reserved > 0) --reservations_;
    handler->end();
  }  // the socket closes here

  std::size_t heldBytes() const {
    return inputHeld_.load(std::memory_order_relaxed) + queued_.load(std::memory_order_relaxed);
  }
  bool atBound() const { return heldBytes() >= options_.maxHeldBytes; }

  void charge(Conn& conn) {
    const std::size_t now = std::max(conn.reserved, conn.in.size());
    if (now >= conn.charged) {
      inputHeld_.fetch_add(now - conn.charged, std::memory_order_relaxed);
    } else {
      inputHeld_.fetch_sub(conn.charged - now, std::memory_order_relaxed);
    }
    conn.charged = now;
  }

  // `restartClock`: its frameTimeout runs from its first reservation (its turn), not from a
  // reservation grown later.
  bool tryReserve(Conn& conn, std::size_t size, bool restartClock = true) {
    const std::size_t others = heldBytes() - conn.charged;
    if (reservations_ > 0 && others + size > options_.maxHeldBytes) return false;
    conn.reserved = size;
    if (restartClock) conn.partialSince = Clock::now();
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

  // Lets held connections go on, in order, while they fit.
  void releaseHeld() {
    {
      std::vector<uint64_t> resumed;
      {
        std::lock_guard lock(mu_);
        resumed.swap(resumed_);
      }
      for (uint64_t id : resumed) {
        if (Conn* conn = find(id)) {
          if (!runCommands(*conn)) markBroken(*conn);
          closeIfDone(id);
        }
      }
    }
    while (!held_.empty()) {
      Conn* conn = find(held_.front());
      if (!conn || !conn->held) {
        held_.pop_front();
        continue;
      }
      tcpstore::Command scratch;
      Dialect dialect = conn->dialect;
      const auto r = dialect == Dialect::kUnknown ? tcpstore::ParseResult{}
                                                  : tcpstore::parseCommand(conn->in, dialect, scratch);
      const bool wantsReservation = r.kind == tcpstore::ParseResult::Kind::kNeedMore &&
                                    r.declared > std::max(conn->reserved, kUnreservedBytes);
      if (wantsReservation) {
        if (!tryReserve(*conn, r.declared)) break;
      } else if (atBound()) {
        break;
      }
      held_.pop_front();
      conn->held = false;
      conn->lastRead = Clock::now();  // the wait was the server's, not the client's
      charge(*conn);
      std::lock_guard lock(mu_);
      watchLocked(*conn);
    }
  }

  void sweepStalled() {
    const auto now = Clock::now();
    if (now - lastSweep_ < std::chrono::seconds(1)) return;
    lastSweep_ = now;
    std::vector<std::pair<uint64_t, std::string>> stalled;
    for (auto& [id, c] : conns_) {
      Conn& conn = *c;
      std::lock_guard lock(mu_);
      if (conn.closeWhenSent || conn.broken) continue;
      const bool partial = !conn.in.empty() && !conn.held && !conn.readPaused && !conn.owedPaused;
      if (partial && now - conn.lastRead >= options_.stallTimeout) {
        stalled.emplace_back(id, fmt::format("its partial command got no byte for {} ms", options_.stallTimeout.count()));
      } else if (partial && now - conn.partialSince >= options_.frameTimeout) {
        stalled.emplace_back(id, fmt::format("its command was not whole after {} ms", options_.frameTimeout.count()));
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
      if (auto held = log_.allow()) {
        spdlog::info("store: closed a TCPStore connection from {}: {}{}", conn->address, why, heldBackNote(*held));
      }
      closeConn(id);
    }
  }

  const TcpStoreServerOptions options_;
  EventLoop loop_;
  std::vector<char> scratch_ = std::vector<char>(kReadChunk);
  tcpstore::Command command_;  // the server's thread: reused
  v1::StoreResponse response_;  // the server's thread: answers given now
  std::string answer_;          // the server's thread: their bytes
  std::atomic<std::size_t> inputHeld_{0};
  std::atomic<std::size_t> queued_{0};
  std::size_t reservations_ = 0;
  std::deque<uint64_t> held_;
  Clock::time_point lastSweep_{};
  std::thread thread_;
  std::thread::id threadId_;
  uint64_t nextId_ = 1;
  LogLimiter log_;

  mutable std::mutex mu_;
  bool stopping_ = false;
  std::deque<Adopted> inbox_;
  std::size_t admitted_ = 0;  // in inbox_ or conns_: what maxConnections bounds
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns_;  // changed by the server's thread only
  std::vector<uint64_t> dirty_;
  std::vector<uint64_t> resumed_;
  TcpStoreServerStats stats_;
};

TcpStoreServer::TcpStoreServer(TcpStoreServerOptions options) : impl_(std::make_shared<Impl>(std::move(options))) {
  impl_->start();
}

TcpStoreServer::TcpStoreServer(StoreCore& core, TcpStoreServerOptions options)
    : TcpStoreServer([&] {
        options.makeSink = [&core](StoreRequestSink::Respond respond) -> std::shared_ptr<StoreRequestSink> {
          return std::make_shared<StoreRequestHandler>(core, std::move(respond));
        };
        return std::move(options);
      }()) {}
TcpStoreServer::~TcpStoreServer() { stop(); }
void TcpStoreServer::adopt(UniqueFd fd) { impl_->adopt(std::move(fd)); }
void TcpStoreServer::stop() { impl_->stop(); }
TcpStoreServerStats TcpStoreServer::stats() const { return impl_->stats(); }

TcpStoreConnectionInfo TcpStoreServer::describe(int fd) {
  TcpStoreConnectionInfo info;
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return info;
  char host[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    info.address = std::string(host) + ":" + std::to_string(ntohs(a->sin_port));
    info.loopback = (ntohl(a->sin_addr.s_addr) >> 24) == 127;
  } else if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    info.address = "[" + std::string(host) + "]:" + std::to_string(ntohs(a->sin6_port));
    info.loopback = IN6_IS_ADDR_LOOPBACK(&a->sin6_addr) ||
                    (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr) && a->sin6_addr.s6_addr[12] == 127);
  } else if (ss.ss_family == AF_UNIX) {
    info.unixSocket = true;
    const auto* a = reinterpret_cast<const sockaddr_un*>(&ss);
    info.address = "unix:" + std::string(a->sun_path, strnlen(a->sun_path, sizeof a->sun_path));
    ucred cred{};
    socklen_t credLen = sizeof cred;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &credLen) == 0) {
      info.pid = cred.pid;
      info.uid = cred.uid;
    }
  }
  return info;
}

}  // namespace ddprun
