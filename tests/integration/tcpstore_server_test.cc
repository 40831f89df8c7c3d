// The TCPStore adapter (store/tcpstore/) on real sockets (loopback, port 0) with a client that
// writes TCPStore's bytes by hand: both dialects, every served command, compare_set's rules, waits
// and CANCEL_WAIT (a STOP_WAITING racing it included), what closes a connection (a bad magic, a
// command byte that names none, an oversized key, a command not served, a stalled partial command,
// a refused binding, a stale round, a store error), and silent connections, counted not timed.
// torch's own clients against the same server: test_tcpstore_protocol.py. libddp's client of the
// same protocol (worker_sdk/tcp_store.h, a single-node job's C++ ranks) at the end.
#include "store/tcpstore/tcpstore_server.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/unique_fd.h"
#include "store/core/store_core.h"
#include "store/core/store_limits.h"
#include "store/tcpstore/tcpstore_codec.h"
#include "worker_sdk/env.h"
#include "worker_sdk/remote_store.h"
#include "worker_sdk/tcp_store.h"

namespace ddprun {
namespace {

using namespace std::chrono_literals;
namespace ts = tcpstore;

// V2 command bytes (torch 2.x).
enum : uint8_t { kValidate = 0, kSet, kCompareSet, kGet, kAdd, kCheck, kWait, kNumKeys, kDelete, kAppend, kMultiGet,
                 kMultiSet, kCancelWait, kPing, kQueuePush, kQueuePop, kQueueLen, kListKeys, kBarrier };

struct Harness {
  explicit Harness(TcpStoreServerOptions options = {}, StoreCoreOptions coreOptions = {}) {
    core = std::make_unique<StoreCore>(std::move(coreOptions));
    if (!options.bind) {
      options.bind = [this](const TcpStoreConnectionInfo& info) -> std::optional<StoreScope> {
        lastInfo = info;
        if (refuse) return std::nullopt;
        return StoreScope{"job", 1};
      };
    }
    server = std::make_unique<TcpStoreServer>(*core, std::move(options));
    listener = UniqueFd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    REQUIRE(::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(listener.get(), 128) == 0);
    REQUIRE(::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len) == 0);
    port = ntohs(addr.sin_port);
    acceptor = std::thread([this] {
      while (!stopping) {
        pollfd p{listener.get(), POLLIN, 0};
        if (::poll(&p, 1, 50) <= 0) continue;
        UniqueFd fd(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
        if (fd) server->adopt(std::move(fd));
      }
    });
  }
  ~Harness() {
    stopping = true;
    acceptor.join();
    server->stop();
    core->shutdown();
  }

  std::unique_ptr<StoreCore> core;
  std::unique_ptr<TcpStoreServer> server;
  UniqueFd listener;
  int port = 0;
  std::atomic<bool> stopping{false};
  std::atomic<bool> refuse{false};
  TcpStoreConnectionInfo lastInfo;
  std::thread acceptor;
};

// A blocking client that writes commands byte by byte as torch's does.
struct Client {
  Client(int, UniqueFd connected) : fd(std::move(connected)) {}
  explicit Client(int port) : fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    REQUIRE(::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  }
  void send(const std::string& bytes) {
    REQUIRE(::send(fd.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size()));
  }
  // Exactly n bytes, or nullopt when the server closed or `timeout` passed first.
  std::optional<std::string> recv(std::size_t n, std::chrono::milliseconds timeout = 5s) {
    std::string out;
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (out.size() < n) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
      pollfd p{fd.get(), POLLIN, 0};
      if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) return std::nullopt;
      char buf[65536];
      const ssize_t r = ::recv(fd.get(), buf, std::min(sizeof buf, n - out.size()), 0);
      if (r <= 0) return std::nullopt;
      out.append(buf, static_cast<std::size_t>(r));
    }
    return out;
  }
  // Whether the server closes the connection within `timeout` (EOF or reset, after any bytes).
  bool closedWithin(std::chrono::milliseconds timeout = 5s) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (true) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
      pollfd p{fd.get(), POLLIN, 0};
      if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
      char buf[4096];
      if (::recv(fd.get(), buf, sizeof buf, 0) <= 0) return true;
    }
  }
  int64_t i64() {
    auto b = recv(8);
    REQUIRE(b);
    int64_t v;
    std::memcpy(&v, b->data(), 8);
    return v;
  }
  uint8_t u8() {
    auto b = recv(1);
    REQUIRE(b);
    return static_cast<uint8_t>((*b)[0]);
  }
  std::string bytes() {
    const auto n = static_cast<std::size_t>(i64());
    auto b = recv(n);
    REQUIRE(b);
    return *b;
  }
  UniqueFd fd;
};

std::string u64(uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }
std::string str(const std::string& s) { return u64(s.size()) + s; }
std::string op(uint8_t b) { return std::string(1, static_cast<char>(b)); }
std::string validate() {
  std::string s = op(kValidate);
  ts::appendU32(s, ts::kValidationMagic);
  return s;
}
std::string keys(const std::vector<std::string>& ks) {
  std::string s = u64(ks.size());
  for (const auto& k : ks) s += str(k);
  return s;
}

// A 2.x client that validated and pinged, as torch's does on connect.
Client v2(int port) {
  Client c(port);
  std::string ping = op(kPing);
  ts::appendU32(ping, 0xabcd1234);
  c.send(validate() + ping);
  auto echo = c.recv(4);
  REQUIRE(echo);
  uint32_t nonce;
  std::memcpy(&nonce, echo->data(), 4);
  REQUIRE(nonce == 0xabcd1234);
  return c;
}

TEST_CASE("tcpstore: a 2.x client validates, pings, and every command answers as torch's server") {
  Harness h;
  Client c = v2(h.port);
  CHECK(h.lastInfo.loopback);
  CHECK_FALSE(h.lastInfo.unixSocket);
  c.send(op(kSet) + str("/a") + str("1"));
  c.send(op(kGet) + str("/a"));
  CHECK(c.bytes() == "1");
  c.send(op(kGet) + str("/missing"));  // torch's server: empty, no wait
  CHECK(c.bytes().empty());
  c.send(op(kAdd) + str("/n") + u64(5));
  CHECK(c.i64() == 5);
  c.send(op(kAdd) + str("/n") + u64(static_cast<uint64_t>(-7)));
  CHECK(c.i64() == -2);
  c.send(op(kGet) + str("/n"));
  CHECK(c.bytes() == "-2");
  c.send(op(kCheck) + keys({"/a", "/n"}));
  CHECK(c.u8() == ts::kCheckReady);
  c.send(op(kCheck) + keys({"/a", "/nope"}));
  CHECK(c.u8() == ts::kCheckNotReady);
  c.send(op(kNumKeys));
  CHECK(c.i64() == 2);
  c.send(op(kAppend) + str("/ap") + str("po"));
  c.send(op(kAppend) + str("/ap") + str("tato"));
  c.send(op(kMultiSet) + u64(2) + str("/m0") + str("v0") + str("/m1") + str(std::string("\0x", 2)));
  c.send(op(kMultiGet) + keys({"/ap", "/m0", "/m1", "/none"}));
  CHECK(c.bytes() == "potato");
  CHECK(c.bytes() == "v0");
  CHECK(c.bytes() == std::string("\0x", 2));
  CHECK(c.bytes().empty());
  c.send(op(kListKeys));
  const auto n = c.i64();
  CHECK(n == 5);
  std::vector<std::string> listed;
  for (int64_t i = 0; i < n; ++i) listed.push_back(c.bytes());
  std::sort(listed.begin(), listed.end());
  CHECK(listed == std::vector<std::string>{"/a", "/ap", "/m0", "/m1", "/n"});
  c.send(op(kDelete) + str("/a"));
  CHECK(c.i64() == 1);
  c.send(op(kDelete) + str("/a"));
  CHECK(c.i64() == 0);
  c.send(op(kNumKeys));
  CHECK(c.i64() == 4);
}

TEST_CASE("tcpstore: compare_set's three rules") {
  Harness h;
  Client c = v2(h.port);
  // Missing key, empty expected: set, answer desired.
  c.send(op(kCompareSet) + str("/k") + str("") + str("first"));
  CHECK(c.bytes() == "first");
  // Missing key, non-empty expected: answer expected, set nothing.
  c.send(op(kCompareSet) + str("/m") + str("exp") + str("x"));
  CHECK(c.bytes() == "exp");
  c.send(op(kCheck) + keys({"/m"}));
  CHECK(c.u8() == ts::kCheckNotReady);
  // Present: set when equal; answer the current value either way.
  c.send(op(kCompareSet) + str("/k") + str("wrong") + str("second"));
  CHECK(c.bytes() == "first");
  c.send(op(kCompareSet) + str("/k") + str("first") + str("second"));
  CHECK(c.bytes() == "second");
  // Present with an empty value and a non-empty expected: the (empty) current value.
  c.send(op(kSet) + str("/e") + str(""));
  c.send(op(kCompareSet) + str("/e") + str("exp") + str("x"));
  CHECK(c.bytes().empty());
}

TEST_CASE("tcpstore: a 1.13 client's numbering, its silent callback connection beside it") {
  Harness h;
  Client callback(h.port);  // torch 1.13 opens it and sends nothing until watch_key
  Client c(h.port);
  c.send(op(0) + str("/a") + str("v"));  // SET
  c.send(op(5) + keys({"/a"}));          // WAIT: present
  CHECK(c.u8() == ts::kStopWaiting);
  c.send(op(2) + str("/a"));  // GET
  CHECK(c.bytes() == "v");
  c.send(op(3) + str("/n") + u64(2));  // ADD
  CHECK(c.i64() == 2);
  c.send(op(1) + str("/a") + str("v") + str("w"));  // COMPARE_SET
  CHECK(c.bytes() == "w");
  c.send(op(4) + keys({"/a", "/n"}));  // CHECK
  CHECK(c.u8() == ts::kCheckReady);
  c.send(op(6));  // GETNUMKEYS
  CHECK(c.i64() == 2);
  c.send(op(8) + str("/a"));  // DELETE_KEY
  CHECK(c.i64() == 1);
  CHECK(h.server->stats().legacy == 1);  // the silent one is not told yet
  CHECK(h.server->stats().open == 2);
  SECTION("WATCH_KEY is not served: the connection closes") {
    callback.send(op(7) + str("/a"));
    CHECK(callback.closedWithin());
  }
  SECTION("a command byte past 1.13's closes") {
    c.send(op(9) + str("/a"));
    CHECK(c.closedWithin());
  }
}

// A sink that answers later, on a thread of its own, as store/forward/'s does: answers in order.
class LaterSink final : public StoreRequestSink {
 public:
  explicit LaterSink(Respond respond) : respond_(std::move(respond)) {}
  void handle(v1::StoreRequest& request) override {
    std::lock_guard lock(mu);
    queued.push_back(request.id());
    ++handled;
  }
  void end() override {}
  // Answers the oldest `n` requests as SETs.
  void answer(std::size_t n) {
    std::vector<uint64_t> ids;
    {
      std::lock_guard lock(mu);
      while (n-- > 0 && !queued.empty()) {
        ids.push_back(queued.front());
        queued.erase(queued.begin());
      }
    }
    for (uint64_t id : ids) {
      v1::StoreResponse r;
      r.set_id(id);
      r.mutable_set();
      respond_(std::move(r));
    }
  }
  std::size_t handledCount() {
    std::lock_guard lock(mu);
    return handled;
  }
  std::mutex mu;
  std::vector<uint64_t> queued;
  std::size_t handled = 0;

 private:
  Respond respond_;
};

TEST_CASE("tcpstore: a sink that answers later is owed at most a bounded number of requests per connection") {
  std::shared_ptr<LaterSink> sink;
  std::mutex sinkMu;
  TcpStoreServerOptions options;
  options.bind = [](const TcpStoreConnectionInfo&) -> std::optional<StoreScope> { return StoreScope{"job", 1}; };
  options.makeSink = [&](StoreRequestSink::Respond respond) -> std::shared_ptr<StoreRequestSink> {
    std::lock_guard lock(sinkMu);
    sink = std::make_shared<LaterSink>(std::move(respond));
    return sink;
  };
  TcpStoreServer server(std::move(options));
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
  server.adopt(UniqueFd(fds[0]));
  Client c(-1, UniqueFd(fds[1]));
  std::string many = validate();
  for (int i = 0; i < 200; ++i) many += op(kSet) + str("/k") + str("v");
  c.send(many);
  auto handled = [&] {
    std::lock_guard lock(sinkMu);
    return sink ? sink->handledCount() : 0;
  };
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (handled() < 64 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(10ms);
  std::this_thread::sleep_for(200ms);
  CHECK(handled() == 64);  // the rest waits, unread, for answers
  std::size_t answered = 0;
  while (answered < 200 && std::chrono::steady_clock::now() < until) {
    const std::size_t before = handled();
    {
      std::lock_guard lock(sinkMu);
      sink->answer(64);
    }
    answered = handled() >= 200 ? 200 : answered;
    const auto stepUntil = std::chrono::steady_clock::now() + 5s;
    while (handled() == before && handled() < 200 && std::chrono::steady_clock::now() < stepUntil) {
      std::this_thread::sleep_for(5ms);
    }
    if (handled() >= 200) {
      std::lock_guard lock(sinkMu);
      sink->answer(200);
      answered = 200;
    }
  }
  CHECK(handled() == 200);  // every command ran, in turn
  CHECK(server.stats().closedBroken == 0);
}

TEST_CASE("tcpstore: a wait answers when its keys arrive, CANCEL_WAIT ends every wait of the connection") {
  Harness h;
  Client c = v2(h.port);
  Client peer = v2(h.port);
  c.send(op(kWait) + keys({"/x", "/y"}));
  peer.send(op(kSet) + str("/x") + str("1"));
  CHECK_FALSE(c.recv(1, 200ms));  // /y still missing
  peer.send(op(kSet) + str("/y") + str("1"));
  CHECK(c.u8() == ts::kStopWaiting);

  c.send(op(kWait) + keys({"/never"}));
  c.send(op(kWait) + keys({"/never2"}));  // a second wait, as a client that pipelines could
  CHECK_FALSE(c.recv(1, 100ms));
  c.send(op(kCancelWait));
  CHECK(c.u8() == ts::kWaitCanceled);
  peer.send(op(kSet) + str("/never") + str("1"));
  peer.send(op(kSet) + str("/never2") + str("1"));
  CHECK_FALSE(c.recv(1, 200ms));  // the cancelled waits never answer
  c.send(op(kGet) + str("/never"));
  CHECK(c.bytes() == "1");
}

TEST_CASE("tcpstore: a STOP_WAITING racing CANCEL_WAIT comes before WAIT_CANCELED, and the stream stays in step") {
  Harness h;
  Client c = v2(h.port);
  Client peer = v2(h.port);
  int late = 0;
  for (int i = 0; i < 100; ++i) {
    const std::string key = "/race" + std::to_string(i);
    c.send(op(kWait) + keys({key}));
    peer.send(op(kSet) + str(key) + str("1"));
    if (i % 3 != 0) std::this_thread::sleep_for(std::chrono::microseconds(50 * (i % 7)));
    c.send(op(kCancelWait));
    uint8_t first = c.u8();
    if (first == ts::kStopWaiting) {
      ++late;
      first = c.u8();
    }
    REQUIRE(first == ts::kWaitCanceled);
    std::string ping = op(kPing);
    ts::appendU32(ping, static_cast<uint32_t>(i));
    c.send(ping);
    auto echo = c.recv(4);
    REQUIRE(echo);
    uint32_t nonce;
    std::memcpy(&nonce, echo->data(), 4);
    REQUIRE(nonce == static_cast<uint32_t>(i));
  }
  INFO("waits answered before their cancel: " << late);
  // And one that is surely late: the peer's set is done (its GET answered) before the cancel.
  c.send(op(kWait) + keys({"/late"}));
  peer.send(op(kSet) + str("/late") + str("1") + op(kGet) + str("/late"));
  CHECK(peer.bytes() == "1");
  c.send(op(kCancelWait));
  CHECK(c.u8() == ts::kStopWaiting);
  CHECK(c.u8() == ts::kWaitCanceled);
  CHECK_FALSE(c.recv(1, 100ms));
}

TEST_CASE("tcpstore: large commands arrive in pieces: a reservation, and one that grows field by field") {
  Harness h;
  Client c = v2(h.port);
  const std::string big(3 << 20, 'b');
  const std::string set = op(kSet) + str("/big") + str(big);
  for (std::size_t at = 0; at < set.size(); at += 100000) {
    c.send(set.substr(at, 100000));
    std::this_thread::sleep_for(1ms);
  }
  c.send(op(kGet) + str("/big"));
  CHECK(c.bytes() == big);
  // Three values of 200 KiB: the command declares more with every field.
  std::string multi = op(kMultiSet) + u64(3);
  for (int i = 0; i < 3; ++i) multi += str("/m" + std::to_string(i)) + str(std::string(200 << 10, static_cast<char>('a' + i)));
  for (std::size_t at = 0; at < multi.size(); at += 50000) c.send(multi.substr(at, 50000));
  c.send(op(kMultiGet) + keys({"/m0", "/m2"}));
  CHECK(c.bytes() == std::string(200 << 10, 'a'));
  CHECK(c.bytes() == std::string(200 << 10, 'c'));
  CHECK(h.server->stats().heldBytes == 0);
}

TEST_CASE("tcpstore: input no TCPStore client sends closes the connection") {
  TcpStoreServerOptions o;
  o.stallTimeout = 300ms;
  std::atomic<int> abuses{0};
  o.onAbuse = [&](const std::string&, const std::string&) { ++abuses; };
  Harness h(o);
  SECTION("a 2.x opening with a wrong magic (read as 1.13 SET, its key length out of bounds)") {
    Client c(h.port);
    c.send(op(kValidate) + std::string("\xff\xff\xff\xff\x01\x00\x00\x00", 8));
    CHECK(c.closedWithin());
    CHECK(abuses == 1);
  }
  SECTION("a command byte that names no 2.x command") {
    Client c = v2(h.port);
    c.send(op(kBarrier + 1));
    CHECK(c.closedWithin());
  }
  SECTION("a second VALIDATE") {
    Client c = v2(h.port);
    c.send(validate());
    CHECK(c.closedWithin());
  }
  SECTION("a key over the store's bound") {
    Client c = v2(h.port);
    c.send(op(kSet) + u64(kMaxStoreKeyBytes + 1));
    CHECK(c.closedWithin());
  }
  SECTION("too many keys in one wait") {
    Client c = v2(h.port);
    c.send(op(kWait) + u64(kMaxStoreKeysPerRequest + 1));
    CHECK(c.closedWithin());
  }
  SECTION("a value over the store's bound") {
    Client c = v2(h.port);
    c.send(op(kSet) + str("/k") + u64(kMaxStoreValueBytes + 1));
    CHECK(c.closedWithin());
  }
  SECTION("commands not served: queues, barrier") {
    for (uint8_t b : {kQueuePush, kQueuePop, kQueueLen, kBarrier}) {
      Client c = v2(h.port);
      c.send(op(b) + str("/q") + u64(1) + u64(0));
      CHECK(c.closedWithin());
    }
    CHECK(abuses == 0);  // not abuse: a real client's call we do not serve
    CHECK(h.server->stats().closedBroken == 4);
  }
  SECTION("a command that stops mid-way closes after stallTimeout") {
    Client c = v2(h.port);
    const auto start = std::chrono::steady_clock::now();
    c.send(op(kSet) + str("/k") + u64(10) + "abc");
    CHECK(c.closedWithin(5s));
    CHECK(std::chrono::steady_clock::now() - start >= 250ms);
    CHECK(h.server->stats().closedStalled == 1);
  }
  SECTION("a store error (add to a value that is no number): no error reply exists, so it closes") {
    Client c = v2(h.port);
    c.send(op(kSet) + str("/t") + str("text"));
    c.send(op(kAdd) + str("/t") + u64(1));
    CHECK(c.closedWithin());
    CHECK(h.server->stats().closedFailed == 1);
  }
  SECTION("an empty key: the store refuses it, the connection closes") {
    Client c = v2(h.port);
    c.send(op(kSet) + str("") + str("v"));
    CHECK(c.closedWithin());
  }
  // The server goes on serving others.
  Client other = v2(h.port);
  other.send(op(kNumKeys));
  CHECK(other.recv(8));
}

TEST_CASE("tcpstore: silent connections are counted, not timed, past maxConnections they are closed") {
  TcpStoreServerOptions o;
  o.maxConnections = 5;
  o.stallTimeout = 200ms;
  o.frameTimeout = 200ms;
  Harness h(o);
  std::vector<Client> silent;
  for (int i = 0; i < 5; ++i) silent.emplace_back(h.port);
  Client extra(h.port);
  CHECK(extra.closedWithin());
  std::this_thread::sleep_for(1500ms);  // past the stall and frame timeouts, and a sweep
  CHECK(h.server->stats().open == 5);
  CHECK(h.server->stats().refused == 1);
  for (auto& c : silent) CHECK_FALSE(c.closedWithin(10ms));
  // A silent one may speak later (1.13's callback connection).
  silent[0].send(validate() + op(kNumKeys));
  CHECK(silent[0].recv(8));
}

TEST_CASE("tcpstore: the binding decides a connection's scope, or refuses it, a stale round closes") {
  std::atomic<bool> current{true};
  StoreCoreOptions co;
  co.roundIsCurrent = [&](const std::string&, uint64_t) { return current.load(); };
  Harness h({}, std::move(co));
  Client c = v2(h.port);
  c.send(op(kSet) + str("/k") + str("v"));
  c.send(op(kGet) + str("/k"));
  CHECK(c.bytes() == "v");
  CHECK(h.core->store().get(StoreScope{"job", 1}, "/k") == std::optional<std::string>("v"));
  current = false;
  c.send(op(kGet) + str("/k"));
  CHECK(c.closedWithin());
  h.refuse = true;
  Client refused(h.port);
  CHECK(refused.closedWithin());
  CHECK(h.server->stats().refused == 1);
}

TEST_CASE("tcpstore: a client that ends its side is closed, its waits forgotten") {
  Harness h;
  Client c = v2(h.port);
  c.send(op(kWait) + keys({"/never"}));
  c.send(op(kNumKeys));
  ::shutdown(c.fd.get(), SHUT_WR);
  CHECK(c.recv(8));  // what it sent before is answered
  CHECK(c.closedWithin());
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (h.core->store().stats().waits > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  CHECK(h.core->store().stats().waits == 0);
}

ddp::TcpStoreOptions libddpOptions(int port) {
  ddp::TcpStoreOptions o;
  o.port = port;
  o.timeout = 5s;
  o.connectTimeout = 5s;
  return o;
}

TEST_CASE("tcpstore: libddp's client (worker_sdk/tcp_store.h): every call of the Store interface") {
  Harness h;
  ddp::TcpStore a(libddpOptions(h.port));
  ddp::TcpStore b(libddpOptions(h.port));
  a.set("k", std::string("v\0w", 3));
  CHECK(b.get("k") == std::string("v\0w", 3));
  CHECK(a.add("n", 5) == 5);
  CHECK(b.add("n", -2) == 3);
  // compare_set as the Store interface says, over TCPStore's rules: a swap, a mismatch, a missing
  // key with an expected value ("" back: TCPStore answers `expected`), a missing key with none.
  CHECK(a.compareSet("k", std::string("v\0w", 3), "x") == "x");
  CHECK(a.compareSet("k", "nope", "y") == "x");
  CHECK(a.compareSet("missing", "old", "new") == "");
  CHECK_FALSE(a.check({"missing"}));
  CHECK(a.compareSet("missing", "same", "same") == "");
  CHECK(a.compareSet("fresh", "", "first") == "first");
  CHECK(b.get("fresh") == "first");
  a.wait({"fresh"}, std::chrono::milliseconds::max());  // "forever": a deadline that does not overflow
  CHECK(a.check({"k", "fresh"}));
  CHECK_FALSE(a.check({"k", "absent"}));
  CHECK(a.numKeys() == 3);  // k, n, fresh
  CHECK(a.deleteKey("k"));
  CHECK_FALSE(a.deleteKey("k"));
  CHECK(h.core->store().get(StoreScope{"job", 1}, "fresh") == std::optional<std::string>("first"));
  CHECK_THROWS_AS(a.set("", "v"), ConfigError);
  CHECK_THROWS_AS(a.get(std::string(kMaxStoreKeyBytes + 1, 'k')), ConfigError);
}

TEST_CASE("tcpstore: libddp's client waits for another's key, and a timed-out wait leaves the connection in step") {
  Harness h;
  ddp::TcpStore a(libddpOptions(h.port));
  ddp::TcpStore b(libddpOptions(h.port));
  std::thread later([&] {
    std::this_thread::sleep_for(100ms);
    b.set("late", "here");
  });
  CHECK(a.get("late") == "here");  // waited: GET alone would answer a missing key with nothing
  later.join();
  try {
    a.wait({"never", "late"}, 200ms);
    FAIL("the wait did not time out");
  } catch (const TimeoutError& e) {
    CHECK(std::string(e.what()).find("never") != std::string::npos);
  }
  // CANCEL_WAIT was answered: the next answers belong to the next calls.
  CHECK(a.add("after", 1) == 1);
  CHECK(a.get("late") == "here");
  CHECK(h.core->store().stats().waits == 0);
}

TEST_CASE("tcpstore: libddp's client is told a refusal and a stale round as ConnectionError") {
  std::atomic<bool> current{true};
  StoreCoreOptions co;
  co.roundIsCurrent = [&](const std::string&, uint64_t) { return current.load(); };
  Harness h({}, std::move(co));
  ddp::TcpStore a(libddpOptions(h.port));
  a.set("k", "v");
  CHECK(a.get("k") == "v");
  current = false;  // the round of a's connection is over
  CHECK_THROWS_AS(a.get("k"), ConnectionError);
  CHECK_THROWS_AS(a.add("n", 1), ConnectionError);  // closed for good
  h.refuse = true;
  CHECK_THROWS_AS(ddp::TcpStore(libddpOptions(h.port)), ConnectionError);
  // Nothing listens: refused until connectTimeout.
  const int port = h.port;
  h.listener.reset();
  auto o = libddpOptions(port);
  o.connectTimeout = 300ms;
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(ddp::TcpStore(o), ConnectionError);
  CHECK(std::chrono::steady_clock::now() - start < 5s);
}

TEST_CASE("tcpstore: makeStore gives libddp's client for a tcpstore:// address, and refuses a malformed one") {
  Harness h;
  std::map<std::string, std::string> vars = {
      {"RANK", "0"},           {"LOCAL_RANK", "0"},        {"WORLD_SIZE", "1"},
      {"LOCAL_WORLD_SIZE", "1"}, {"GROUP_RANK", "0"},     {"GROUP_WORLD_SIZE", "1"},
      {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(h.port)}, {"TORCHELASTIC_RUN_ID", "job"},
      {"DDPRUN_STORE_ADDR", "tcpstore://127.0.0.1:" + std::to_string(h.port)},
      {"DDPRUN_STORE_PREFIX", "/run/job/round/1/"}, {"DDPRUN_ROUND", "1"}};
  auto store = ddp::makeStore(ddp::Env::fromEnvironment(vars), 3s);
  REQUIRE(dynamic_cast<ddp::TcpStore*>(store.get()) != nullptr);
  CHECK(store->timeout() == 3s);
  store->set("x", "1");
  CHECK(store->get("x") == "1");  // answered after the set (one connection, in order), so it is in
  CHECK(h.core->store().get(StoreScope{"job", 1}, "x") == std::optional<std::string>("1"));
  for (const char* bad : {"tcpstore://127.0.0.1", "tcpstore://127.0.0.1:0", "tcpstore://127.0.0.1:70000",
                          "tcpstore://:5", "tcpstore://127.0.0.1:port"}) {
    vars["DDPRUN_STORE_ADDR"] = bad;
    CHECK_THROWS_AS(ddp::makeStore(ddp::Env::fromEnvironment(vars)), ConfigError);
  }
}

}  // namespace
}  // namespace ddprun
