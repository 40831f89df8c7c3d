#include "netguard/connection_listener.h"

#include <dirent.h>
#include <fcntl.h>
#include <grpcpp/server.h>
#include <grpcpp/server_posix.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/error.h"
#include "common/event_loop.h"
#include "common/http2_refusal.h"
#include "common/log_limiter.h"
#include "common/net.h"
#include "common/unique_fd.h"
#include "netguard/connection_opening.h"
#include "netguard/connection_relay.h"
#include "netguard/handed_connections.h"

namespace ddprun {
namespace {

using Clock = std::chrono::steady_clock;

std::size_t openFileLimit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return 1 << 20;
  return static_cast<std::size_t>(limit.rlim_cur);
}

// Descriptors this process has open now (the entries of /proc/self/fd, less the one reading it).
std::size_t openFdCount() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (!dir) return 0;
  std::size_t n = 0;
  while (dirent* e = ::readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  ::closedir(dir);
  return n > 0 ? n - 1 : 0;
}

// Listens on every address `host` resolves to ("localhost" may be 127.0.0.1 and ::1), as gRPC's
// own listener did; with port 0 the first socket picks the port and the others take the same.
std::vector<UniqueFd> bindListeners(const std::string& host, int port, int* boundPort) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* results = nullptr;
  std::string service = std::to_string(port);
  int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &results);
  if (rc != 0) throw ConnectionError("cannot resolve '" + host + "': " + ::gai_strerror(rc));
  std::vector<UniqueFd> socks;
  std::string error = "no address";
  *boundPort = port;
  // "::" alone listens dual-stack, as before; only beside an IPv4 address of its own (localhost)
  // does an IPv6 socket keep to IPv6.
  bool anyV4 = false;
  for (addrinfo* ai = results; ai; ai = ai->ai_next) anyV4 = anyV4 || ai->ai_family == AF_INET;
  for (addrinfo* ai = results; ai; ai = ai->ai_next) {
    UniqueFd sock(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
    if (!sock) continue;
    int one = 1;
    ::setsockopt(sock.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (ai->ai_family == AF_INET6 && anyV4) ::setsockopt(sock.get(), IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
    sockaddr_storage addr{};
    std::memcpy(&addr, ai->ai_addr, ai->ai_addrlen);
    const uint16_t chosen = htons(static_cast<uint16_t>(*boundPort));
    if (addr.ss_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port = chosen;
    if (addr.ss_family == AF_INET) reinterpret_cast<sockaddr_in*>(&addr)->sin_port = chosen;
    if (::bind(sock.get(), reinterpret_cast<sockaddr*>(&addr), ai->ai_addrlen) != 0 || ::listen(sock.get(), 4096) != 0) {
      error = std::strerror(errno);
      if (socks.empty()) continue;
      ::freeaddrinfo(results);
      throw ConnectionError("cannot listen on " + joinHostPort(host, *boundPort) + ": " + error);
    }
    socklen_t len = sizeof(addr);
    ::getsockname(sock.get(), reinterpret_cast<sockaddr*>(&addr), &len);
    *boundPort = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                                  : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    socks.push_back(std::move(sock));
  }
  ::freeaddrinfo(results);
  if (socks.empty()) throw ConnectionError("cannot listen on " + joinHostPort(host, port) + ": " + error);
  return socks;
}

}  // namespace

class ConnectionListener::Impl {
 public:
  explicit Impl(ConnectionListenerOptions options) : options_(std::move(options)) {
    listen_ = bindListeners(options_.host, options_.port, &port_);
    for (std::size_t i = 0; i < listen_.size(); ++i) loop_.add(listen_[i].get(), kListenKey + i, EPOLLIN);
    spare_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  }

  ~Impl() { stop(); }

  int port() const { return port_; }

  void start(grpc::Server* server) {
    server_ = server;
    if (options_.relay || options_.tls) {
      RelayTls tls;
      tls.context = options_.tls;
      tls.handshakeTimeout = options_.handshakeTimeout;
      tls.onFailure = [this](const std::string& address, const std::string& why) { tlsFailure(address, why); };
      relay_ = std::make_unique<ConnectionRelay>(options_.abuse, RelayToken{options_.tokenMetadataKey, options_.token},
                                                 [this](const std::string& address, const std::string& why) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          ++stats_.relayCutForAbuse;
        }
        penalize(address, "it " + why);
      }, std::move(tls));
    }
    baseline_ = openFdCount();
    estimate_ = baseline_;
    handed_ = std::make_unique<HandedConnections>(options_.abuse,
                                                  static_cast<int>(std::max<std::size_t>(64, baseline_ + 32)));
    thread_ = std::thread([this] { run(); });
  }

  void stop() {
    if (!thread_.joinable()) return;
    loop_.wake();  // the loop's only wake-up: it stops
    thread_.join();
    pending_.clear();  // closes them
    listen_.clear();
    relay_.reset();  // closes the relayed connections: gRPC sees them end
  }

  // `open`: a scrape drops the handed connections whose descriptor gRPC closed meanwhile.
  ConnectionListenerStats stats() {
    const std::size_t open = handed_ ? handed_->open() : 0;
    std::lock_guard<std::mutex> lock(mu_);
    ConnectionListenerStats s = stats_;
    s.open = open;
    return s;
  }

  std::string peerAddress(const std::string& grpcPeer) const { return handed_ ? handed_->address(grpcPeer) : ""; }

  bool admitCall(const std::string& grpcPeer, bool authenticated) {
    if (!handed_) return true;
    const auto v = handed_->admit(grpcPeer, authenticated, Clock::now());
    using Then = HandedConnections::Verdict::Then;
    if (v.then == Then::kTrust) relay_->trust(v.relayId);
    if (v.then == Then::kCut) {
      count(&ConnectionListenerStats::closedForAbuse);
      if (v.relayId != 0) relay_->close(v.relayId, "made " + v.why);
      penalize(v.address, "it made " + v.why);
    }
    return v.admitted;
  }

  // A TLS connection that failed: counted and said (a line per 10 s at most), as every connection
  // the front door closes. Not penalized: a wrong certificate is a configuration error, and a
  // stalled handshake costs only its descriptors until the timeout.
  void tlsFailure(const std::string& address, const std::string& why) {
    count(&ConnectionListenerStats::tlsFailed);
    if (auto held = tlsLog_.allow()) {
      spdlog::warn("rendezvous: closed a TLS connection from {}: {}{}", address, why, heldBackNote(*held));
    }
  }

  // `address` broke the limits: refuse it for a while, and say so.
  void penalize(const std::string& address, const std::string& why) {
    std::chrono::milliseconds penalty{0};
    {
      std::lock_guard<std::mutex> lock(mu_);
      penalty = penalties_.offended(address, Clock::now(), options_.abuse);
    }
    if (auto held = penaltyLog_.allow()) {
      spdlog::warn("rendezvous: closed a connection from {}: {}; refusing the address for {} ms{}", address, why,
                   penalty.count(), heldBackNote(*held));
    }
  }

 private:
  enum class Admission { kNormal, kGated, kProbation };

  struct Pending {
    UniqueFd fd;
    std::string address;
    uint64_t seq = 0;   // tells this connection from a later one on the same descriptor number
    // Its address is penalized: only a request with the token passes (gated), or, where no token
    // is asked, it stays untrusted (probation).
    Admission admission = Admission::kNormal;
  };

  // Connections open now, counted by what holds descriptors. Cheap: /proc/self/fd is read only
  // when the estimate (last count plus accepts since) reaches the cap.
  std::size_t capNow() const {
    const std::size_t limit = openFileLimit();
    std::size_t cap = limit > options_.reserveFds ? limit - options_.reserveFds : 0;
    if (options_.maxConnections > 0) cap = std::min(cap, baseline_ + options_.maxConnections);
    return cap;
  }

  // Descriptors a connection holds: its socket, and with the guard the relay's socket pair.
  std::size_t perConnection() const { return relay_ ? 3 : 1; }

  // Whether the connection just accepted (its descriptor open already) would take the process
  // past the cap, counting what it will hold (the guard's pair too).
  bool atCap() {
    const std::size_t cap = capNow();
    const std::size_t more = perConnection() - 1;  // beyond the accepted socket
    if (estimate_ + 1 + more <= cap) return false;
    // Counted: the open descriptors (the accepted socket among them), and the pairs that the
    // connections still waiting for their preface will get when they are handed over. (Counting
    // only what was open let a flood take the process 80 descriptors past the cap with the guard
    // on: the pending connections' pairs came after the count.) At most every kRecountEvery: at
    // the cap, a scan of 20,000 entries per refused connection kept a core busy for 18 s draining
    // a queue of 2,400 (issue #37, item 3); between scans the estimate holds.
    const auto now = Clock::now();
    if (now - lastCount_ < kRecountEvery) return true;
    lastCount_ = now;
    estimate_ = openFdCount() + pending_.size() * more;
    return estimate_ + more > cap;
  }

  // One epoll set holds the wake-up pipe, the listening sockets and every connection still waiting
  // for its first bytes (level-triggered): a mass start of thousands costs each wake-up only what
  // is ready. (A poll() over every pending connection, rebuilt at each wake-up, made a 6,000-agent
  // start and a flood beside it quadratic: most of the daemon's CPU was in the kernel's poll.)
  void run() {
    // After an accept error the listeners rest until then, whatever else wakes the loop (a
    // pending connection's bytes): else every wake-up retried accept() into the same EMFILE.
    Clock::time_point acceptPausedUntil{};
    bool listening = true;
    while (true) {
      auto now = Clock::now();
      const bool paused = now < acceptPausedUntil;
      if (paused == listening) {  // a level-triggered listener would wake the loop all pause long
        listening = !paused;
        for (std::size_t i = 0; i < listen_.size(); ++i) watch(listen_[i].get(), kListenKey + i, listening ? EPOLLIN : 0u);
      }
      Clock::time_point next = now + std::chrono::seconds(1);
      if (paused) next = std::min(next, acceptPausedUntil);
      if (!deadlines_.empty()) next = std::min(next, deadlines_.front().at);
      if (!repeek_.empty()) next = std::min(next, repeek_.begin()->first);
      const auto events = loop_.wait(next);
      if (loop_.rung()) break;  // stop()
      bool accept = false;
      now = Clock::now();
      // Pending connections first: the ones accepted below were not waited for yet.
      for (const epoll_event& e : events) {
        if (e.data.u64 >= kListenKey) accept = true;
        else serve(static_cast<int>(e.data.u64), e.events, now);
      }
      if (accept && now >= acceptPausedUntil) {
        for (const auto& l : listen_) {
          const auto pause = acceptAll(l.get(), now);
          if (pause.count() > 0) acceptPausedUntil = std::max(acceptPausedUntil, now + pause);
        }
      }
      lookAgain(now);
      expire(now);
    }
  }

  void watch(int fd, uint64_t key, uint32_t events) { loop_.modify(fd, key, events); }

  // Accepts until the backlog is empty; returns how long to pause accepting (after an error).
  std::chrono::milliseconds acceptAll(int listenFd, Clock::time_point now) {
    for (int i = 0; i < 256; ++i) {
      int fd = ::accept4(listenFd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return std::chrono::milliseconds(0);
        // EMFILE, ENFILE, ENOBUFS, ENOMEM: drain one connection through the spare descriptor so
        // the backlog does not fill with clients that wait forever, and pause a little.
        count(&ConnectionListenerStats::acceptErrors);
        if (auto held = acceptErrorLog_.allow()) {
          spdlog::warn("rendezvous: accept failed: {}; pausing new connections{}", std::strerror(errno),
                       heldBackNote(*held));
        }
        spare_.reset();
        UniqueFd dropped(::accept4(listenFd, nullptr, nullptr, SOCK_CLOEXEC));
        spare_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
        return std::chrono::milliseconds(50);
      }
      UniqueFd conn(fd);
      std::string address = peerOf(conn.get());
      // An address that broke the limits lately: with a token to look for in the relay, its
      // connections are let in gated (only a request with the job token passes), so that agents
      // behind the same address (one host, a NAT gateway) go on joining; without one, they are
      // closed here, before they cost anything.
      // Without a token there is nothing to gate on: its connections are let in on probation, as
      // strangers (untrustedCallBurst streams, the strangers' shared budget, never trusted), so
      // that a job's agents behind that address still join (issue #37, item 2: refused, they
      // waited out penalties of up to 60 s) while an attacker among them gets no more than any
      // stranger. Only with the guard off is a penalized address refused.
      Admission admission = Admission::kNormal;
      if (penalized(address, now)) {
        if (options_.relay && options_.gate) {
          admission = options_.token.empty() ? Admission::kProbation : Admission::kGated;
        }
        if (auto held = refusedLog_.allow(now)) {
          const char* what = admission == Admission::kGated      ? "admitted only with the job token"
                             : admission == Admission::kProbation ? "admitted on probation (as a stranger)"
                                                                  : "refused";
          spdlog::warn("rendezvous: {} a connection from {}: the address broke the call limits lately{}", what, address,
                       heldBackNote(*held));
        }
        if (admission == Admission::kNormal) {
          count(&ConnectionListenerStats::refusedPenalized);
          continue;
        }
      }
      // At the cap, an idle stranger makes room: the relay cuts the untrusted connection that
      // opened no stream for longest (never one that showed the token), so that strangers'
      // connections cannot lock a job out. Its descriptors free as it closes; the reserve
      // (reserveFds) takes the overlap.
      const bool full = atCap();
      if (full && relay_ && relay_->evictIdle(kIdleBeforeEviction)) {
        count(&ConnectionListenerStats::evictedIdle);
        estimate_ -= std::min(estimate_, perConnection());
        if (auto held = evictLog_.allow(now)) {
          spdlog::warn("rendezvous: at the connection limit ({} descriptors): cut a connection idle without the job "
                       "token to make room{}", capNow(), heldBackNote(*held));
        }
      } else if (full) {
        count(&ConnectionListenerStats::refusedAtCap);
        if (auto held = capLog_.allow(now)) {
          spdlog::warn("rendezvous: refusing connections: {} descriptors open, the limit is {} ({} per connection; "
                       "--max_connections, or raise the open-file limit){}", estimate_, capNow(), perConnection(),
                       heldBackNote(*held));
        }
        refuse(conn.get(), "ddprun-rdzv is at its connection limit (" + std::to_string(capNow()) + " descriptors, " +
                               std::to_string(perConnection()) + " per connection); raise its open-file limit or "
                               "--max_connections");
        continue;  // closed here: the client sees the connection end at once, and why
      }
      estimate_ += perConnection();
      int one = 1;
      ::setsockopt(conn.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      const int number = conn.get();
      const uint64_t seq = ++lastSeq_;
      loop_.add(number, static_cast<uint64_t>(number), EPOLLIN | EPOLLRDHUP);
      pending_.insert_or_assign(number, Pending{std::move(conn), std::move(address), seq, admission});
      // One timeout for all: arrival order is deadline order.
      deadlines_.push_back(Deadline{now + options_.handshakeTimeout, number, seq});
    }
    return std::chrono::milliseconds(0);
  }

  // Says why before a fresh connection is closed: a GOAWAY carrying `reason`
  // (common/http2_refusal.h), which an agent's connect probe reads back to say it was refused, and
  // why. Without the server's SETTINGS first, gRPC's client does not take the connection for a
  // working one (with them, it did, lost the session at once and gave up after the rejoin window
  // instead of waiting for room as before).
  // Best effort: what the client sent is read first, so that the close is a FIN, not a reset
  // that could discard the answer.
  static void refuse(int fd, const std::string& reason) {
    char sink[4096];
    while (::recv(fd, sink, sizeof(sink), MSG_DONTWAIT) > 0) {
    }
    const std::string frames = http2GoAway(reason);
    (void)!::send(fd, frames.data(), frames.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    ::shutdown(fd, SHUT_WR);
  }

  // Every connection the front door closes is counted and said, a line per 10 s for each reason.
  void closedSilent(const Pending& p, const char* why, Clock::time_point now) {
    count(&ConnectionListenerStats::closedSilent);
    if (auto held = silentLog_.allow(now)) {
      spdlog::info("rendezvous: closed a connection from {}: {}{}", p.address, why, heldBackNote(*held));
    }
  }

  // A pending connection's bytes (or its end): hand it over once its first bytes are there, close
  // it when it ended or sent what no client of ours sends.
  void serve(int number, uint32_t events, Clock::time_point now) {
    auto it = pending_.find(number);
    if (it == pending_.end()) return;
    Pending& p = it->second;
    if (events & EPOLLIN) {
      char buf[kHttp2PrefaceBytes];
      const ssize_t n = ::recv(p.fd.get(), buf, sizeof(buf), MSG_PEEK);
      const bool ended = n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR);
      const std::string_view peeked(buf, n > 0 ? static_cast<std::size_t>(n) : 0);
      switch (classifyOpening(peeked, OpeningRules{.tls = static_cast<bool>(options_.tls),
                                                   .sideMagic = options_.sideProtocol.magic})) {
        case Opening::kHttp2:
        case Opening::kTlsHandshake:
          return handOver(takePending(it), now);
        case Opening::kSideProtocol: {
          if (p.admission == Admission::kProbation) {
            // Probation is the relay's (a stranger's budget of streams); the store framing has no
            // strangers' budget, so a penalized address is refused there as before. Its workers
            // fall back to the Session stream, which passes the relay on probation.
            count(&ConnectionListenerStats::refusedPenalized);
            takePending(it);
            return;
          }
          Pending taken = takePending(it);
          count(&ConnectionListenerStats::handedToSide);
          options_.sideProtocol.accept(std::move(taken.fd), taken.address);
          return;
        }
        case Opening::kPlaintextOnTls:
          // A plaintext client (gRPC without TLS) is told why in words before the close, as its
          // agent then exits 2 saying so.
          refuse(p.fd.get(), std::string(kTlsRequiredReason) + ": connect with --rdzv_conf protocol=https");
          tlsFailure(p.address, "a plaintext HTTP/2 client (this server requires TLS)");
          takePending(it);
          return;
        case Opening::kNotTls:
          return closeSilent(it, "it did not start a TLS handshake", now);
        case Opening::kNeedMore:
          if (ended) {
            return closeSilent(it, options_.tls ? "it closed before a TLS handshake"
                                                : "it closed before sending the HTTP/2 preface",
                               now);
          }
          break;
      }
      // Part of what it must send: look again in 20 ms, not in a busy loop (level-triggered).
      watch(number, static_cast<uint64_t>(number), EPOLLRDHUP);
      repeek_.emplace(now + std::chrono::milliseconds(20), std::pair{number, p.seq});
    } else if (events & (EPOLLERR | EPOLLHUP | EPOLLRDHUP)) {
      closeSilent(it, "it closed before sending the HTTP/2 preface", now);
    }
  }

  // The connections that sent part of their first bytes: waited for again.
  void lookAgain(Clock::time_point now) {
    while (!repeek_.empty() && repeek_.begin()->first <= now) {
      const auto [number, seq] = repeek_.begin()->second;
      repeek_.erase(repeek_.begin());
      auto it = pending_.find(number);
      if (it != pending_.end() && it->second.seq == seq) watch(number, static_cast<uint64_t>(number), EPOLLIN | EPOLLRDHUP);
    }
  }

  // The connections whose first bytes did not come within the handshake timeout.
  void expire(Clock::time_point now) {
    while (!deadlines_.empty() && deadlines_.front().at <= now) {
      const Deadline d = deadlines_.front();
      deadlines_.pop_front();
      auto it = pending_.find(d.number);
      if (it == pending_.end() || it->second.seq != d.seq) continue;  // handed over or closed already
      closeSilent(it, options_.tls ? "no TLS handshake started within the handshake timeout"
                                   : "no HTTP/2 preface within the handshake timeout", now);
    }
  }

  // Out of the pending set (and of the epoll set: its descriptor may live on, in gRPC or the relay).
  Pending takePending(std::unordered_map<int, Pending>::iterator it) {
    loop_.remove(it->first);
    Pending p = std::move(it->second);
    pending_.erase(it);
    return p;
  }

  void closeSilent(std::unordered_map<int, Pending>::iterator it, const char* why, Clock::time_point now) {
    Pending p = takePending(it);
    closedSilent(p, why, now);
  }  // p's descriptor closes here

  static std::string peerOf(int fd) {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    char host[NI_MAXHOST] = "";
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      ::getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof(host), nullptr, 0, NI_NUMERICHOST);
    }
    std::string peer = host;
    if (peer.rfind("::ffff:", 0) == 0 && peer.find('.') != std::string::npos) peer = peer.substr(7);  // mapped IPv4
    return peer;
  }

  bool penalized(const std::string& address, Clock::time_point now) {
    std::lock_guard<std::mutex> lock(mu_);
    return penalties_.refused(address, now);
  }

  void handOver(Pending p, Clock::time_point now) {
    handOver(std::move(p.fd), std::move(p.address), now, p.admission);
  }

  void handOver(UniqueFd fd, std::string address, Clock::time_point now, Admission admission) {
    uint64_t relayId = 0;
    const bool probation = admission == Admission::kProbation;
    if (relay_) {
      const bool trusted = !probation && (!options_.tokenRequired || !options_.gate);
      auto added = relay_->add(std::move(fd), address, trusted, admission == Admission::kGated);
      if (!added.grpcSide) {
        count(&ConnectionListenerStats::acceptErrors);  // no socket pair: descriptors ran out
        return;
      }
      fd = std::move(added.grpcSide);
      relayId = added.id;
    }
    fd = handed_->add(std::move(fd), std::move(address), relayId, probation, now);
    // gRPC owns the descriptor from here on and closes it when the connection ends.
    grpc::AddInsecureChannelFromFd(server_, fd.release());
    count(&ConnectionListenerStats::handedOver);
  }

  void count(uint64_t ConnectionListenerStats::*field) {
    std::lock_guard<std::mutex> lock(mu_);
    ++(stats_.*field);
  }

  ConnectionListenerOptions options_;
  std::vector<UniqueFd> listen_;
  UniqueFd spare_;  // closed to accept (and drop) one connection when descriptors run out
  int port_ = 0;
  grpc::Server* server_ = nullptr;
  std::thread thread_;
  // Accept thread only: the connections waiting for their first bytes, by descriptor number; their
  // deadlines in arrival order; the ones that sent part of them, by when to look again.
  std::unordered_map<int, Pending> pending_;
  struct Deadline {
    Clock::time_point at;
    int number;
    uint64_t seq;
  };
  std::deque<Deadline> deadlines_;
  std::multimap<Clock::time_point, std::pair<int, uint64_t>> repeek_;
  uint64_t lastSeq_ = 0;
  EventLoop loop_{512};
  Clock::time_point lastCount_{};  // the last scan of /proc/self/fd (atCap)
  LogLimiter evictLog_;
  static constexpr auto kRecountEvery = std::chrono::milliseconds(100);
  // An untrusted connection that opened no stream for this long may be cut for a newcomer at the
  // cap: a client of ours makes its first call as it connects.
  static constexpr auto kIdleBeforeEviction = std::chrono::seconds(2);
  static constexpr uint64_t kListenKey = uint64_t{1} << 62;  // + the listener's index
  std::size_t baseline_ = 0;      // descriptors open before the first connection
  std::size_t estimate_ = 0;      // accept thread only
  // One line per 10 s for each event a flood repeats; the next line counts what was held back.
  LogLimiter acceptErrorLog_, capLog_, penaltyLog_, refusedLog_, silentLog_, tlsLog_;
  mutable std::mutex mu_;
  ConnectionListenerStats stats_;
  // Connections handed to gRPC, by descriptor number: who connected, the socket's inode, and the
  // call budget. An entry stays after its connection ended until the number is used again.
  std::unique_ptr<HandedConnections> handed_;  // set in start()
  AddressPenalties penalties_;
  std::unique_ptr<ConnectionRelay> relay_;  // set in start() when options_.relay
};

ConnectionListener::ConnectionListener(ConnectionListenerOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}
ConnectionListener::~ConnectionListener() = default;
int ConnectionListener::port() const { return impl_->port(); }
void ConnectionListener::start(grpc::Server* server) { impl_->start(server); }
void ConnectionListener::stop() { impl_->stop(); }
ConnectionListenerStats ConnectionListener::stats() const { return impl_->stats(); }
std::string ConnectionListener::peerAddress(const std::string& grpcPeer) const { return impl_->peerAddress(grpcPeer); }
bool ConnectionListener::admitCall(const std::string& grpcPeer, bool authenticated) {
  return impl_->admitCall(grpcPeer, authenticated);
}
void ConnectionListener::penalize(const std::string& address, const std::string& why) { impl_->penalize(address, why); }

}  // namespace ddprun
