#include "netguard/connection_relay.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/event_loop.h"
#include "common/http2_refusal.h"
#include "netguard/handshake_queue.h"
#include "netguard/http2_frames.h"
#include "netguard/relay_buffer.h"
#include "netguard/tls_termination.h"
#include "netguard/token_recognizer.h"
#include "tls/tls_session.h"

namespace ddprun {
namespace {

using Clock = std::chrono::steady_clock;

struct Side {
  UniqueFd fd;
  bool readClosed = false;  // read 0 (EOF) from it
  uint32_t interest = 0;    // events registered with epoll now
};

struct Relayed {
  uint64_t id = 0;
  std::string address;
  Side client;
  Side inner;       // our end of the socket pair; gRPC holds the other
  RelayBuffer toServer;  // read from client, written to inner
  RelayBuffer toClient;  // read from inner, written to client
  Http2FrameScanner scanner;  // what the client sends: counted
  TokenBucket streams;
  TokenBucket control;
  bool trusted = false;
  // While not trusted: looks for the job token in its request headers (token_recognizer.h).
  std::unique_ptr<TokenRecognizer> recognizer;
  // From an address that broke the limits lately: nothing passes to gRPC until its first request
  // headers show the job token, and a request without it closes the connection.
  bool gated = false;
  // Streams of the chunk read last that wait for the untrusted connections' shared budget; while
  // not 0 nothing more is read from the client and nothing is passed to gRPC.
  double heldStreams = 0;
  bool innerWriteShut = false;
  bool clientWriteShut = false;
  Http2FrameScanner serverFrames{false};  // what gRPC sends: only where its frames end
  // With TLS: the client's side is ciphertext; toServer and toClient hold plaintext.
  std::unique_ptr<TlsTermination> tls = nullptr;
  // Its handshake: waits for one of its address's slots (nothing is read meanwhile), holds one,
  // or is over.
  enum class Handshake { kNone, kQueued, kActive, kDone } handshake = Handshake::kNone;
  // When it last opened a stream (or was added): an untrusted connection that opens none for long
  // is the first to go when the front door needs room at its cap (evictIdle).
  Clock::time_point lastStream{};
  // Being closed with a reason (close(id, why)): nothing more of the client reaches gRPC, what
  // gRPC writes still reaches the client until the grace ends; then a GOAWAY saying why.
  bool draining = false;
  std::string drainWhy{};
  // The highest stream of what was passed to gRPC: the GOAWAY of a cut names it, so that the
  // client sends again, on a new connection, only what gRPC never saw.
  uint32_t forwardedStream = 0;
};

// epoll's data for a side: the connection's id and which side.
uint64_t key(uint64_t id, bool inner) { return (id << 1) | (inner ? 1 : 0); }

}  // namespace

class ConnectionRelay::Impl {
 public:
  Impl(AbuseLimits limits, RelayToken token, std::function<void(const std::string&, const std::string&)> onAbuse,
       RelayTls tls)
      : limits_(limits),
        tokenKey_(std::move(token.metadataKey)),
        token_(std::move(token.value)),
        onAbuse_(std::move(onAbuse)),
        tls_(std::move(tls)),
        untrusted_(limits.untrustedStreamsPerSecond, limits.untrustedStreamsPerSecond, Clock::now()),
        handshakes_(HandshakeQueue::Options{tls_.maxHandshakesPerAddress, tls_.handshakeTimeout, tls_.stallGrace}) {
    thread_ = std::thread([this] { run(); });
  }

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    wake();
    thread_.join();
  }

  Added add(UniqueFd client, const std::string& address, bool trusted, bool gated) {
    int pair[2];
    // Both ends non-blocking: gRPC expects that of a descriptor it is given, as accept4 makes them.
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, pair) != 0) return {};
    UniqueFd inner(pair[0]), grpcSide(pair[1]);
    ::fcntl(client.get(), F_SETFL, ::fcntl(client.get(), F_GETFL) | O_NONBLOCK);
    auto r = std::make_unique<Relayed>(Relayed{0, address, Side{std::move(client)}, Side{std::move(inner)}, {}, {}, {},
                                               TokenBucket(limits_.callsPerSecond,
                                                           trusted ? limits_.callBurst : limits_.untrustedCallBurst,
                                                           Clock::now()),
                                               TokenBucket(limits_.controlFramesPerSecond, limits_.controlFrameBurst,
                                                           Clock::now()),
                                               trusted, nullptr, gated && !trusted});
    if (!trusted && !token_.empty()) r->recognizer = std::make_unique<TokenRecognizer>(tokenKey_, token_);
    r->lastStream = Clock::now();
    if (tls_.context) {
      try {
        r->tls = std::make_unique<TlsTermination>(std::make_unique<TlsSession>(tls_.context->current()));
      } catch (const std::exception&) {
        return {};  // out of memory: as without a socket pair
      }
    }
    uint64_t id;
    {
      std::lock_guard<std::mutex> lock(mu_);
      id = r->id = ++lastId_;
      ++stats_.relayed;
      ++stats_.open;
      inbox_.push_back(std::move(r));
    }
    wake();
    return {std::move(grpcSide), id};
  }

  void close(uint64_t id, std::string why) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closeRequests_.emplace_back(id, std::move(why));
    }
    wake();
  }

  void trust(uint64_t id) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      trustRequests_.push_back(id);
    }
    wake();
  }

  bool evictIdle(std::chrono::milliseconds idleFor) {
    auto request = std::make_shared<Eviction>();
    request->idleFor = idleFor;
    auto answer = request->done.get_future();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return false;
      evictRequests_.push_back(request);
    }
    wake();
    // The relay's thread answers within one turn of its loop; a bound all the same, so that the
    // front door never waits on a relay that is stopping.
    return answer.wait_for(std::chrono::seconds(2)) == std::future_status::ready && answer.get();
  }

  ConnectionRelayStats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

 private:
  void wake() { loop_.wake(); }

  void run() {
    while (true) {
      auto until = Clock::time_point::max();
      if (!timers_.empty()) until = timers_.begin()->first;
      if (!drains_.empty()) until = std::min(until, drains_.begin()->first);
      until = std::min(until, handshakes_.nextCheck());
      if (!again_.empty() || !promoted_.empty()) until = Clock::now();
      // Nothing to do but what its descriptors bring: no wake-up without a cause.
      const auto events = loop_.wait(until, std::chrono::hours(1));
      // Requests first: a trust() or close() made before the client's next bytes were sent then
      // applies to them, whatever order epoll reports the two in (the loop consumed the wake-up
      // before returning, so none made meanwhile goes unnoticed).
      if (!takeInbox()) break;
      for (const epoll_event& e : events) {
        auto it = conns_.find(e.data.u64 >> 1);
        if (it == conns_.end()) continue;  // closed by an earlier event of this batch
        serve(*it->second, (e.data.u64 & 1) != 0, e.events);
      }
      readAgain();
      releaseDue();
      expireHandshakes();
      endDrains();
    }
    conns_.clear();  // closes every descriptor
  }

  // New connections and close requests from other threads; false once stopping.
  bool takeInbox() {
    std::vector<std::unique_ptr<Relayed>> added;
    std::vector<std::pair<uint64_t, std::string>> closing;
    std::vector<uint64_t> trusting;
    std::vector<std::shared_ptr<Eviction>> evicting;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) {
        for (auto& e : evictRequests_) e->done.set_value(false);
        evictRequests_.clear();
        return false;
      }
      added.swap(inbox_);
      closing.swap(closeRequests_);
      trusting.swap(trustRequests_);
      evicting.swap(evictRequests_);
    }
    for (auto& r : added) {
      const uint64_t id = r->id;
      Relayed& ref = *r;
      conns_.emplace(id, std::move(r));
      if (ref.tls) queueHandshake(ref);
      update(ref);
    }
    for (uint64_t id : trusting) {
      auto it = conns_.find(id);
      if (it == conns_.end()) continue;
      makeTrusted(*it->second);
      if (it->second->heldStreams > 0) release(*it->second);
    }
    for (auto& [id, why] : closing) {
      auto it = conns_.find(id);
      if (it == conns_.end()) continue;
      if (why.empty()) {
        drop(id, false);
        continue;
      }
      // The answer gRPC is writing for the call that broke the limits (RESOURCE_EXHAUSTED, and
      // why) reaches the client first: cut at once, it heard only "Socket closed".
      drain(*it->second, std::move(why));
    }
    for (auto& e : evicting) e->done.set_value(evictOne(e->idleFor));
    return true;
  }

  void drain(Relayed& r, std::string why) {
    if (r.draining) return;
    r.draining = true;
    r.drainWhy = std::move(why);
    drains_.emplace(Clock::now() + kDrainGrace, r.id);
    update(r);
  }

  // Connections whose grace after close(id, why) ended: told why, and cut.
  void endDrains() {
    const auto now = Clock::now();
    while (!drains_.empty() && drains_.begin()->first <= now) {
      const uint64_t id = drains_.begin()->second;
      drains_.erase(drains_.begin());
      auto it = conns_.find(id);
      if (it == conns_.end()) continue;
      tellCut(*it->second, it->second->drainWhy.c_str());
      drop(id, false);
    }
  }

  // The untrusted connection idle longest, if for idleFor at least: told why, and cut. A scan of
  // the connections, made only when the front door is at its cap.
  bool evictOne(std::chrono::milliseconds idleFor) {
    const auto now = Clock::now();
    Relayed* oldest = nullptr;
    for (auto& [id, r] : conns_) {
      if (r->trusted || now - r->lastStream < idleFor) continue;
      if (!oldest || r->lastStream < oldest->lastStream) oldest = r.get();
    }
    if (!oldest) return false;
    tellCut(*oldest, "was idle without the job token while the server was at its connection limit");
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.evictedIdle;
    }
    drop(oldest->id, false);
    return true;
  }

  // What the client sent waits: for the shared budget, or for the token of a gated connection.
  static bool waits(const Relayed& r) { return r.heldStreams > 0 || (r.gated && !r.trusted) || r.draining; }

  void makeTrusted(Relayed& r) {
    if (r.trusted) return;
    r.trusted = true;
    r.recognizer.reset();
    r.streams = TokenBucket(limits_.callsPerSecond, limits_.callBurst, Clock::now());
  }

  void serve(Relayed& r, bool innerSide, uint32_t events) {
    Side& from = innerSide ? r.inner : r.client;
    RelayBuffer& in = innerSide ? r.toClient : r.toServer;
    bool progress = false;
    if ((events & (EPOLLIN | EPOLLHUP | EPOLLERR)) && !from.readClosed && in.room() > 0 &&
        !(!innerSide && r.handshake == Relayed::Handshake::kQueued)) {
      const char* abuse = nullptr;
      if (!readInto(r, from, in, !innerSide, &progress, &abuse)) {
        if (r.tls && !r.tls->error().empty()) return tlsFailed(r, r.tls->error());
        return drop(r.id, false);
      }
      if (abuse) return cutForAbuse(r.id, abuse);
      // The handshake's replies (and alerts) go out at once.
      if (!innerSide && r.tls && !sendTo(r, true, &progress)) return drop(r.id, false);
    }
    const bool held = r.heldStreams > 0 || r.handshake == Relayed::Handshake::kQueued;
    // A held client that hung up wants nothing more: its streams (or its turn) are not worth it.
    if (held && !innerSide && (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR))) return drop(r.id, false);
    // What waits for the side the event came from (its EPOLLOUT), then what was just read from it
    // (passed on at once: saves a round through epoll). To the client: the handshake's replies too.
    if ((events & (EPOLLOUT | EPOLLHUP | EPOLLERR)) && !(innerSide && waits(r))) {
      if (!sendTo(r, !innerSide, &progress)) return drop(r.id, false);
    }
    if (!(!innerSide && waits(r)) && !sendTo(r, innerSide, &progress)) return drop(r.id, false);
    if ((events & (EPOLLHUP | EPOLLERR)) && !progress) return drop(r.id, false);  // gone, nothing more to move
    if (!finishHalfCloses(r)) return drop(r.id, false);
    update(r);
  }

  // Writes what waits for the client (toClient: encrypted first with TLS) or for gRPC (toServer).
  bool sendTo(Relayed& r, bool toClient, bool* progress) {
    if (!toClient) return writeBuffered(r.inner.fd.get(), r.toServer, progress);
    if (!r.tls) return writeBuffered(r.client.fd.get(), r.toClient, progress);
    return r.tls->send(r.client.fd.get(), r.toClient, progress);
  }

  // Whether anything waits to be written to the client now.
  static bool clientWritable(const Relayed& r) {
    return r.tls ? r.tls->wantsWrite(r.toClient) : r.toClient.size() > 0;
  }

  // From the client: plaintext, as recv(2) returns it (0: the end; -1 with errno). With TLS, reads
  // ciphertext until a record decrypts, and answers the handshake on the way.
  ssize_t receiveFromClient(Relayed& r, char* out, std::size_t capacity) {
    if (!r.tls) return ::recv(r.client.fd.get(), out, capacity, 0);
    bool heard = false;
    const ssize_t n = r.tls->receive(r.client.fd.get(), out, capacity, &heard);
    const int saved = errno;
    if (r.handshake == Relayed::Handshake::kActive) {
      if (heard) handshakes_.progressed(r.id, Clock::now());
      if (r.tls->established()) {
        endHandshake(r);
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.tlsEstablished;
      }
    }
    errno = saved;  // what the caller reads of a -1
    return n;
  }

  // A TLS connection stopped reading with records still inside OpenSSL (its buffer filled, or its
  // streams were held): read them when there is room, as no socket event will come for them.
  void readAgain() {
    // Handshakes that got their slot: now they are read (their ClientHello waits in the socket).
    for (uint64_t id : std::exchange(promoted_, {})) {
      auto it = conns_.find(id);
      if (it != conns_.end()) update(*it->second);
      if (it != conns_.end()) again_.push_back(id);
    }
    std::vector<uint64_t> ids;
    ids.swap(again_);
    for (uint64_t id : ids) {
      auto it = conns_.find(id);
      if (it != conns_.end()) serve(*it->second, false, EPOLLIN);
    }
  }

  // Handshakes wait for their address's turn (HandshakeQueue): nothing of a waiting one is read.
  void queueHandshake(Relayed& r) {
    if (handshakes_.arrive(r.id, r.address, Clock::now())) {
      r.handshake = Relayed::Handshake::kActive;
      return;
    }
    r.handshake = Relayed::Handshake::kQueued;
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.tlsQueued;
  }

  // r's handshake is over (done, failed, or r is closing): its slot goes to the next in line.
  void endHandshake(Relayed& r) {
    r.handshake = Relayed::Handshake::kDone;
    for (uint64_t next : handshakes_.end(r.id, Clock::now())) {
      auto c = conns_.find(next);
      if (c == conns_.end()) continue;
      c->second->handshake = Relayed::Handshake::kActive;
      promoted_.push_back(next);
    }
  }

  void expireHandshakes() {
    for (const auto& e : handshakes_.expired(Clock::now())) {
      auto it = conns_.find(e.id);
      if (it == conns_.end() || !it->second->tls || it->second->tls->established()) {
        handshakes_.end(e.id, Clock::now());  // gone or done: not a handshake any more
        continue;
      }
      if (e.why == HandshakeQueue::Why::kTimedOut) {
        tlsFailed(*it->second, "no TLS handshake within " + std::to_string(tls_.handshakeTimeout.count()) + " ms");
      } else {
        tlsFailed(*it->second, "its TLS handshake sent nothing for " + std::to_string(tls_.stallGrace.count()) +
                                   " ms while other connections from its address waited their turn");
      }
    }
  }

  // Says why (the alert OpenSSL queued, best effort), tells the listener for its log, then
  // closes: told first, so that whoever sees the close finds the reason already logged.
  void tlsFailed(Relayed& r, std::string why) {  // a copy: why may be r's own, which drop() frees
    r.tls->flush(r.client.fd.get());
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.tlsFailed;
    }
    if (tls_.onFailure) tls_.onFailure(r.address, why);
    drop(r.id, false);
  }

  // Reads what fits into `in`; from the client, counts frames against the limits and stops at
  // the first chunk that breaks them (*abuse says which; that chunk is not passed on).
  bool readInto(Relayed& r, Side& from, RelayBuffer& in, bool fromClient, bool* progress, const char** abuse) {
    char chunk[65536];
    while (in.room() > 0) {
      const std::size_t want = std::min(sizeof(chunk), in.room());
      ssize_t n = fromClient ? receiveFromClient(r, chunk, want) : ::recv(from.fd.get(), chunk, want, 0);
      if (n < 0) {
        if (errno == EINTR) continue;
        return errno == EAGAIN || errno == EWOULDBLOCK;
      }
      *progress = true;
      if (n == 0) {
        from.readClosed = true;
        return true;
      }
      if (fromClient) {
        const uint32_t forwardedBefore = r.scanner.highestStream();
        const auto counts = r.scanner.feed(chunk, static_cast<std::size_t>(n));
        const auto now = Clock::now();
        const char* why = nullptr;
        if (counts.newStreams > 0) r.lastStream = now;
        if (counts.newStreams > 0 && !r.streams.take(static_cast<double>(counts.newStreams), now)) {
          why = "opened streams faster than allowed";
        } else if (counts.controlFrames > 0 && !r.control.take(static_cast<double>(counts.controlFrames), now)) {
          why = "sent control frames (PING, SETTINGS, RST_STREAM...) faster than allowed";
        }
        if (why) {
          r.forwardedStream = forwardedBefore;  // this chunk is not passed on
          *abuse = why;
          return true;
        }
        r.forwardedStream = r.scanner.highestStream();
        if (r.recognizer) {
          // The job token in this chunk's request headers: trusted before its streams are counted
          // against the strangers' budget. A connection that gave up looking waits as before.
          const auto verdict = r.recognizer->feed(chunk, static_cast<std::size_t>(n));
          if (verdict == TokenRecognizer::Verdict::kFound) {
            makeTrusted(r);
            std::lock_guard<std::mutex> lock(mu_);
            ++stats_.recognized;
          } else if (verdict == TokenRecognizer::Verdict::kGaveUp) {
            r.recognizer.reset();
          }
        }
        if (r.gated && !r.trusted && (!r.recognizer || r.recognizer->blocksDecoded() > 0)) {
          // A request from a penalized address without the token: not an agent of the job.
          std::lock_guard<std::mutex> lock(mu_);
          ++stats_.gatedClosed;
          return false;
        }
        if (!r.trusted && counts.newStreams > 0 && !untrusted_.take(static_cast<double>(counts.newStreams), now)) {
          // All unauthenticated connections together are over their budget: hold this chunk and
          // stop reading until the budget has refilled enough for it (releaseDue). Holding costs
          // nothing but the chunk in the connection's own bounded buffer, so every connection may
          // wait (a cap here closed the agents of a mass start past about 1,300: issue #24).
          in.bytes.insert(in.bytes.end(), chunk, chunk + n);
          hold(r, static_cast<double>(counts.newStreams), now);
          return true;
        }
      }
      if (!fromClient) r.serverFrames.feed(chunk, static_cast<std::size_t>(n));
      in.bytes.insert(in.bytes.end(), chunk, chunk + n);
    }
    return true;
  }

  void hold(Relayed& r, double streams, Clock::time_point now) {
    r.heldStreams = streams;
    const double rate = std::max(limits_.untrustedStreamsPerSecond, 1.0);
    timers_.emplace(now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(streams / rate)),
                    r.id);
  }

  // Passes on a held chunk and reads on.
  void release(Relayed& r) {
    r.heldStreams = 0;
    bool progress = false;
    if (!writeBuffered(r.inner.fd.get(), r.toServer, &progress) || !finishHalfCloses(r)) return drop(r.id, false);
    update(r);
  }

  void releaseDue() {
    const auto now = Clock::now();
    while (!timers_.empty() && timers_.begin()->first <= now) {
      const uint64_t id = timers_.begin()->second;
      timers_.erase(timers_.begin());
      auto it = conns_.find(id);
      if (it == conns_.end() || it->second->heldStreams <= 0) continue;  // closed, or trusted meanwhile
      Relayed& r = *it->second;
      if (untrusted_.take(r.heldStreams, now)) {
        release(r);
      } else {
        hold(r, r.heldStreams, now);
      }
    }
  }

  // A side that ended its writing: once everything it sent was passed on, end the other side's
  // writing too. False when both sides are done: the connection is over.
  static bool finishHalfCloses(Relayed& r) {
    if (r.client.readClosed && r.toServer.size() == 0 && !r.innerWriteShut) {
      ::shutdown(r.inner.fd.get(), SHUT_WR);
      r.innerWriteShut = true;
    }
    if (r.inner.readClosed && r.toClient.size() == 0 && !r.clientWriteShut) {
      // TLS ends with close_notify, then the FIN.
      if (!r.tls || r.tls->closeNotify(r.client.fd.get())) {
        ::shutdown(r.client.fd.get(), SHUT_WR);
        r.clientWriteShut = true;
      }
    }
    return !(r.innerWriteShut && r.clientWriteShut);
  }

  void update(Relayed& r) {
    const bool held = r.heldStreams > 0;
    const bool queued = r.handshake == Relayed::Handshake::kQueued;
    setInterest(r, r.client, false,
                (!r.client.readClosed && r.toServer.room() > 0 && !held && !queued && !r.draining ? EPOLLIN : 0u) |
                    (held || queued ? EPOLLRDHUP : 0u) | (clientWritable(r) ? EPOLLOUT : 0u));
    if (r.tls && r.tls->mayHaveMore() && !r.client.readClosed && r.toServer.room() > 0 && !waits(r)) {
      again_.push_back(r.id);
    }
    setInterest(r, r.inner, true,
                (!r.inner.readClosed && r.toClient.room() > 0 ? EPOLLIN : 0u) |
                    (r.toServer.size() > 0 && !waits(r) ? EPOLLOUT : 0u));
  }

  void setInterest(Relayed& r, Side& side, bool inner, uint32_t events) {
    if (side.interest == events + 1) return;  // +1: 0 means "not registered yet"
    if (side.interest == 0) {
      loop_.add(side.fd.get(), key(r.id, inner), events);
    } else {
      loop_.modify(side.fd.get(), key(r.id, inner), events);
    }
    side.interest = events + 1;
  }

  void cutForAbuse(uint64_t id, const char* why) {
    auto it = conns_.find(id);
    if (it == conns_.end()) return;
    Relayed& r = *it->second;
    if (onAbuse_) onAbuse_(r.address, why);  // before the close, as in tlsFailed
    if (r.trusted) {
      // It showed the token (or none is asked): a client of the job that went too fast, not an
      // attacker. The answers of the calls gRPC got still reach it, then the GOAWAY names the
      // limit and the last stream gRPC saw, so that its library sends the rest again on a new
      // connection instead of failing them with "Socket closed" (issue #37, item 7).
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.closedForAbuse;
      }
      drain(r, why);
      return;
    }
    tellCut(r, why);
    drop(id, true);
  }

  // The client hears why before the connection ends: a GOAWAY naming the limit, after what gRPC
  // sent so far, if that ends on a frame boundary (else it would be read as part of a frame).
  // Best effort, never blocking: a client that does not read gets only the close.
  void tellCut(Relayed& r, const char* why) {
    if (r.clientWriteShut || !r.serverFrames.atFrameBoundary()) return;
    if (r.tls && !r.tls->established()) return;
    // Its last stream: the highest that reached gRPC (each may have been processed); the client
    // may send those above it again.
    const std::string goAway =
        http2GoAway(std::string("ddprun-rdzv closed the connection: it ") + why, r.forwardedStream);
    r.toClient.bytes.insert(r.toClient.bytes.end(), goAway.begin(), goAway.end());
    bool progress = false;
    sendTo(r, true, &progress);
    ::shutdown(r.client.fd.get(), SHUT_WR);
    // What the client sent and nobody read would make the close a reset, which can discard the
    // GOAWAY on the client's side before it reads it: read (and drop) what is there, bounded.
    char sink[16384];
    for (int i = 0; i < 64 && ::recv(r.client.fd.get(), sink, sizeof(sink), MSG_DONTWAIT) > 0; ++i) {
    }
  }

  void drop(uint64_t id, bool abuse) {
    auto it = conns_.find(id);
    if (it == conns_.end()) return;
    // Closing the descriptors removes them from epoll. The client sees the connection end; gRPC
    // sees its side of the pair end and cancels the connection's calls.
    std::unique_ptr<Relayed> gone = std::move(it->second);
    conns_.erase(it);
    if (gone->handshake == Relayed::Handshake::kActive || gone->handshake == Relayed::Handshake::kQueued) {
      endHandshake(*gone);
    }
    std::lock_guard<std::mutex> lock(mu_);
    --stats_.open;
    if (abuse) ++stats_.closedForAbuse;
  }

  AbuseLimits limits_;
  const std::string tokenKey_;
  const std::string token_;  // empty: no token to look for
  std::function<void(const std::string&, const std::string&)> onAbuse_;
  RelayTls tls_;
  EventLoop loop_;
  TokenBucket untrusted_;  // streams of every connection not trusted yet, together
  std::unordered_map<uint64_t, std::unique_ptr<Relayed>> conns_;  // relay thread only
  std::multimap<Clock::time_point, uint64_t> timers_;            // held connections, by due time
  std::vector<uint64_t> again_;  // TLS connections with records left in OpenSSL (readAgain)
  HandshakeQueue handshakes_;  // TLS handshakes, per client address
  std::vector<uint64_t> promoted_;  // got their handshake slot: to read at once (readAgain)
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Relayed>> inbox_;
  std::vector<std::pair<uint64_t, std::string>> closeRequests_;
  std::multimap<Clock::time_point, uint64_t> drains_;  // connections closing with a reason, by end of grace
  // How long gRPC's last answers may take to reach a client that close(id, why) cuts.
  static constexpr auto kDrainGrace = std::chrono::milliseconds(200);
  std::vector<uint64_t> trustRequests_;
  struct Eviction {
    std::chrono::milliseconds idleFor{};
    std::promise<bool> done;
  };
  std::vector<std::shared_ptr<Eviction>> evictRequests_;
  uint64_t lastId_ = 0;
  bool stopping_ = false;
  ConnectionRelayStats stats_;
  std::thread thread_;
};

ConnectionRelay::ConnectionRelay(AbuseLimits limits, RelayToken token,
                                 std::function<void(const std::string& address, const std::string& why)> onAbuse,
                                 RelayTls tls)
    : impl_(std::make_unique<Impl>(limits, std::move(token), std::move(onAbuse), std::move(tls))) {}
ConnectionRelay::~ConnectionRelay() = default;
ConnectionRelay::Added ConnectionRelay::add(UniqueFd client, const std::string& address, bool trusted, bool gated) {
  return impl_->add(std::move(client), address, trusted, gated);
}
void ConnectionRelay::trust(uint64_t id) { impl_->trust(id); }
void ConnectionRelay::close(uint64_t id, std::string why) { impl_->close(id, std::move(why)); }
bool ConnectionRelay::evictIdle(std::chrono::milliseconds idleFor) { return impl_->evictIdle(idleFor); }
ConnectionRelayStats ConnectionRelay::stats() const { return impl_->stats(); }

}  // namespace ddprun
