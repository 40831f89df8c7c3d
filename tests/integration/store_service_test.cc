// StoreService and StoreClient over real gRPC on loopback (port 0): every operation, blocking
// gets and waits, timeouts, the job token, fencing by round, limits, and shutdown under a waiter.
#include <arpa/inet.h>
#include <catch2/catch.hpp>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "ddprun/v1/store.grpc.pb.h"
#include "rpc/grpc_util.h"
#include "store/client/store_client.h"
#include "common/net.h"
#include "netguard/connection_listener.h"
#include "store/grpc/store_service.h"
#include "store/wire/store_wire.h"
#include "store/wire/store_wire_server.h"
#include "safety_bound.h"

using namespace std::chrono_literals;
using ddprun::StoreClient;
using ddprun::StoreClientOptions;
using Catch::Matchers::Contains;

namespace {

// How the test server serves the store: gRPC alone (a client falls back to the Session stream),
// or behind the rendezvous server's front door, which hands the store's own framing
// (store/store_wire.h) to a StoreWireServer and HTTP/2 to gRPC. Every case below runs with both.
enum class Serve { kGrpc, kFrontDoor };
#define SERVE_BOTH()                                                \
  const Serve serve = GENERATE(Serve::kGrpc, Serve::kFrontDoor); \
  INFO("served by " << (serve == Serve::kGrpc ? "gRPC alone" : "the front door (store wire)"))

// A real server with the service on it; stopped, as a user of the service must, by failing the
// pending waits first and then shutting the server down.
struct TestServer {
  explicit TestServer(ddprun::StoreCoreOptions options = {}, std::string address = "127.0.0.1:0",
                      Serve serve = Serve::kGrpc)
      : core(std::move(options)), service(core) {
    grpc::ServerBuilder builder;
    ddprun::applyServerDefaults(builder);
    if (serve == Serve::kGrpc) builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
    REQUIRE(server != nullptr);
    if (serve == Serve::kFrontDoor) {
      wire = std::make_unique<ddprun::StoreWireServer>(core, ddprun::StoreWireServerOptions{});
      const auto [host, p] = ddprun::parseEndpoint(address, 0);
      ddprun::ConnectionListenerOptions listen;
      listen.host = host;
      listen.port = p;
      listen.sideProtocol.magic = std::string(ddprun::storewire::kMagic);
      listen.sideProtocol.accept = [this](ddprun::UniqueFd fd, const std::string& from) {
        wire->adopt(std::move(fd), from);
      };
      listener = std::make_unique<ddprun::ConnectionListener>(listen);
      port = listener->port();
      listener->start(server.get());
    }
    REQUIRE(port > 0);
  }
  ~TestServer() { stop(); }
  void stop() {
    if (!server) return;
    if (listener) listener->stop();
    core.shutdown();
    service.shutdown();
    if (wire) wire->stop();
    server->Shutdown();
    server.reset();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }

  ddprun::StoreCore core;  // declared first: outlives the adapters and the server
  ddprun::StoreService service;
  int port = 0;
  std::unique_ptr<ddprun::StoreWireServer> wire;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<ddprun::ConnectionListener> listener;
};

StoreClientOptions clientOptions(const TestServer& server) {
  StoreClientOptions o;
  o.address = server.address();
  o.runId = "job";
  o.round = 1;
  o.timeout = 5s;
  o.connectTimeout = 5s;
  return o;
}

std::unique_ptr<ddprun::v1::Store::Stub> rawStub(const TestServer& server) {
  return ddprun::v1::Store::NewStub(ddprun::makeChannel(server.address()));
}

template <typename F>
std::string errorOf(F&& call) {
  try {
    call();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("store service: every operation round-trips", "[store]") {
  SERVE_BOTH();
  TestServer server({}, "127.0.0.1:0", serve);
  StoreClient client(clientOptions(server));
  const std::string bytes("a\0b\xff", 4);
  client.set("k", bytes);
  CHECK(client.get("k") == bytes);
  CHECK(client.add("n", 3) == 3);
  CHECK(client.add("n", -1) == 2);
  CHECK(client.compareSet("c", "", "first") == "first");
  CHECK(client.compareSet("c", "wrong", "second") == "first");
  CHECK(client.compareSet("c", "first", "second") == "second");
  CHECK(client.check({"k", "n", "c"}));
  CHECK_FALSE(client.check({"k", "absent"}));
  client.wait({"k", "n"});
  CHECK(client.numKeys() == 3);
  CHECK(client.deleteKey("k"));
  CHECK_FALSE(client.deleteKey("k"));
  CHECK(client.numKeys() == 2);
  client.set("text", "not a number");
  CHECK_THROWS_AS(client.add("text", 1), ddprun::StateError);
}

TEST_CASE("store service: rounds and runs do not see each other's keys", "[store]") {
  SERVE_BOTH();
  TestServer server({}, "127.0.0.1:0", serve);
  auto o = clientOptions(server);
  StoreClient round1(o);
  o.round = 2;
  StoreClient round2(o);
  o.runId = "other";
  StoreClient otherRun(o);
  round1.set("nccl_id", "old");
  CHECK_FALSE(round2.check({"nccl_id"}));
  CHECK_FALSE(otherRun.check({"nccl_id"}));
  CHECK(round2.numKeys() == 0);
}

TEST_CASE("store service: a value larger than gRPC's default 4 MiB limit passes", "[store]") {
  SERVE_BOTH();
  TestServer server({}, "127.0.0.1:0", serve);
  StoreClient client(clientOptions(server));
  const std::string big(10 << 20, 'x');
  client.set("big", big);
  CHECK(client.get("big") == big);
}

TEST_CASE("store service: get blocks until another client sets the key", "[store]") {
  SERVE_BOTH();
  TestServer server({}, "127.0.0.1:0", serve);
  StoreClient waiter(clientOptions(server));
  StoreClient setter(clientOptions(server));
  std::atomic<bool> setDone{false};
  auto got = std::async(std::launch::async, [&] {
    std::string value = waiter.get("late");
    return std::make_pair(value, setDone.load());
  });
  auto waitOn = std::async(std::launch::async, [&] { waiter.wait({"late", "later"}); });
  std::this_thread::sleep_for(200ms);
  REQUIRE(got.wait_for(0s) == std::future_status::timeout);  // still blocked
  setDone = true;
  setter.set("late", "value");
  auto [value, afterSet] = got.get();
  CHECK(value == "value");
  CHECK(afterSet);
  CHECK(waitOn.wait_for(100ms) == std::future_status::timeout);  // still needs "later"
  setter.add("later", 1);
  waitOn.get();
}

TEST_CASE("store service: timeouts raise TimeoutError naming the missing keys", "[store]") {
  SERVE_BOTH();
  TestServer server({}, "127.0.0.1:0", serve);
  auto o = clientOptions(server);
  o.timeout = 200ms;
  StoreClient client(o);
  client.set("present", "1");
  CHECK_THROWS_AS(client.get("missing_key"), ddprun::TimeoutError);
  // The server's timeout answered, naming the key; not the client's deadline (the timeout plus a
  // margin), which cancels the call "with no answer".
  const std::string getError = errorOf([&] { client.get("missing_key"); });
  CHECK_THAT(getError, Contains("'missing_key'") && !Contains("no answer"));
  const std::string waitError = errorOf([&] { client.wait({"present", "absent"}, 100ms); });
  // The server names only the keys still missing.
  CHECK_THAT(waitError, Contains("key(s) 'absent' of run 'job' round 1"));
  CHECK_THROWS_AS(client.wait({"absent"}, 0ms), ddprun::TimeoutError);
  CHECK(server.core.store().nextDeadline() == std::nullopt);  // nothing left pending
}

TEST_CASE("store service: the job token is required when configured", "[store]") {
  SERVE_BOTH();
  TestServer server(ddprun::StoreCoreOptions{.token = "s3cret", .roundIsCurrent = nullptr, .jobExists = nullptr, .maxPendingPerConnection = 1024, .limits = {}}, "127.0.0.1:0", serve);
  auto o = clientOptions(server);
  {
    StoreClient noToken(o);
    CHECK_THROWS_AS(noToken.set("k", "v"), ddprun::ConnectionError);
    CHECK_THAT(errorOf([&] { noToken.numKeys(); }), Contains("invalid job token"));
  }
  {
    o.token = "s3creT";
    StoreClient wrong(o);
    CHECK_THAT(errorOf([&] { wrong.get("k"); }), Contains("invalid job token"));
    CHECK_THAT(errorOf([&] { wrong.get("k"); }), !Contains("s3cre"));
  }
  o.token = "s3cret";
  StoreClient right(o);
  right.set("k", "v");
  CHECK(right.get("k") == "v");
}

TEST_CASE("store service: a stale round is refused", "[store]") {
  SERVE_BOTH();
  std::atomic<uint64_t> current{2};
  ddprun::StoreCoreOptions options;
  options.roundIsCurrent = [&](const std::string& runId, uint64_t round) {
    return runId == "job" && round == current.load();
  };
  TestServer server(options, "127.0.0.1:0", serve);
  auto o = clientOptions(server);
  o.round = 1;
  StoreClient stale(o);
  CHECK_THROWS_AS(stale.set("k", "v"), ddprun::StateError);
  CHECK_THAT(errorOf([&] { stale.get("k"); }), Contains("stale round"));
  o.round = 2;
  StoreClient live(o);
  live.set("k", "v");
  CHECK(live.get("k") == "v");

  SECTION("a round that ends under a waiter fails the wait as stale") {
    auto waiting = std::async(std::launch::async, [&] { return errorOf([&] { live.get("never"); }); });
    std::this_thread::sleep_for(100ms);
    current = 3;
    server.core.store().dropRoundsBefore("job", 3);
    REQUIRE(waiting.wait_for(3s) == std::future_status::ready);
    CHECK_THAT(waiting.get(), Contains("stale round"));
  }
}

TEST_CASE("store service: bad keys are refused", "[store]") {
  SERVE_BOTH();
  TestServer server({}, "127.0.0.1:0", serve);
  StoreClient client(clientOptions(server));
  CHECK_THROWS_AS(client.set(std::string(5000, 'k'), "v"), ddprun::ConfigError);
  CHECK_THROWS_AS(client.get(""), ddprun::ConfigError);

  // The server checks too, whatever a client sends.
  auto stub = rawStub(server);
  ddprun::v1::SetRequest request;
  request.mutable_scope()->set_run_id("job");
  request.set_key(std::string(5000, 'k'));
  ddprun::v1::SetResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + 5s);
  CHECK(stub->Set(&context, request, &response).error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  grpc::ClientContext emptyContext;
  emptyContext.set_deadline(std::chrono::system_clock::now() + 5s);
  request.set_key("");
  CHECK(stub->Set(&emptyContext, request, &response).error_code() ==
        grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_CASE("store service: 8 clients adding concurrently give the exact total", "[store]") {
  SERVE_BOTH();
  TestServer server({}, "127.0.0.1:0", serve);
  constexpr int kClients = 8;
  constexpr int kAdds = 100;
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&] {
      StoreClient client(clientOptions(server));
      for (int i = 0; i < kAdds; ++i) client.add("counter", 1);
    });
  }
  for (auto& t : threads) t.join();
  StoreClient reader(clientOptions(server));
  CHECK(reader.get("counter") == std::to_string(kClients * kAdds));
}

TEST_CASE("store service: a client that gives up cancels its wait on the server", "[store]") {
  SERVE_BOTH();
  TestServer server({}, "127.0.0.1:0", serve);
  auto stub = rawStub(server);
  ddprun::v1::GetRequest request;
  request.mutable_scope()->set_run_id("job");
  request.set_key("never");
  request.set_timeout_ms(60000);
  ddprun::v1::GetResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + 200ms);
  CHECK(stub->Get(&context, request, &response).error_code() ==
        grpc::StatusCode::DEADLINE_EXCEEDED);
  // The server learns of the cancellation asynchronously; its 60 s wait must go away.
  const auto until = std::chrono::steady_clock::now() + 3s;
  while (server.core.store().nextDeadline() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(10ms);
  }
  CHECK(server.core.store().nextDeadline() == std::nullopt);
}

TEST_CASE("store service: shutdown while a client waits ends the wait with an error", "[store]") {
  SERVE_BOTH();
  TestServer server({}, "127.0.0.1:0", serve);
  auto o = clientOptions(server);
  o.timeout = 60s;
  StoreClient client(o);
  auto waiting = std::async(std::launch::async, [&] {
    try {
      client.get("never");
    } catch (const ddprun::ConnectionError&) {
      return true;
    }
    return false;
  });
  std::this_thread::sleep_for(100ms);

  SECTION("with the service's shutdown first") { server.stop(); }
  SECTION("with only the server's shutdown, bounded by a deadline") {
    if (server.wire) server.wire->stop();  // the store wire's server, the front door's half of it
    server.server->Shutdown(std::chrono::system_clock::now() + 100ms);
  }
  REQUIRE(waiting.wait_for(5s) == std::future_status::ready);
  CHECK(waiting.get());
}

TEST_CASE("store client: connecting retries until the server is up or the limit passes", "[store]") {
  SERVE_BOTH();
  SECTION("a server that never comes") {
    int port = 0;
    {
      TestServer gone({}, "127.0.0.1:0", serve);
      port = gone.port;
    }
    StoreClientOptions o;
    o.address = "127.0.0.1:" + std::to_string(port);
    o.connectTimeout = 300ms;
    const auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_AS(StoreClient(o), ddprun::ConnectionError);
    // The 300 ms limit, not the default 10 s: a bound between the two, with room for a loaded machine.
    CHECK(std::chrono::steady_clock::now() - start < 8s);
  }
  SECTION("a server that comes late") {
    int port = 0;
    {
      TestServer first({}, "127.0.0.1:0", serve);
      port = first.port;
    }
    const std::string address = "127.0.0.1:" + std::to_string(port);
    auto connecting = std::async(std::launch::async, [&] {
      StoreClientOptions o;
      o.address = address;
      o.runId = "job";
      o.connectTimeout = 5s;
      StoreClient client(o);
      return client.add("connected", 1);
    });
    std::this_thread::sleep_for(300ms);
    TestServer late({}, address, serve);
    REQUIRE(connecting.wait_for(5s) == std::future_status::ready);
    CHECK(connecting.get() == 1);
  }
}

namespace {

int listenOnLoopback(int* port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0);
  REQUIRE(::listen(fd, 64) == 0);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  *port = ntohs(addr.sin_port);
  return fd;
}

// A TCP relay in front of a server. It can hold every new connection for `delay` before it passes
// bytes on (a server too busy to answer a handshake at once, as one is when a hundred workers
// connect together), and freeze: stop passing bytes while keeping every connection open (a peer
// host gone without a word, a firewall that dropped the connection).
class TcpRelay {
 public:
  explicit TcpRelay(int targetPort, std::chrono::milliseconds delay = 0ms) : targetPort_(targetPort), delay_(delay) {
    listenFd_ = listenOnLoopback(&port_);
    acceptor_ = std::thread([this] { acceptLoop(); });
  }
  void freeze() { frozen_ = true; }
  ~TcpRelay() {
    stopping_ = true;
    acceptor_.join();
    for (auto& t : relays_) t.join();
    ::close(listenFd_);
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  void acceptLoop() {
    while (!stopping_) {
      pollfd p{listenFd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      int client = ::accept4(listenFd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) continue;
      relays_.emplace_back([this, client] { relay(client); });
    }
  }

  void relay(int client) {
    for (auto until = std::chrono::steady_clock::now() + delay_; std::chrono::steady_clock::now() < until;) {
      if (stopping_) break;
      std::this_thread::sleep_for(10ms);
    }
    int server = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(targetPort_));
    bool open = !stopping_ && ::connect(server, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    char buf[16384];
    while (open && !stopping_) {
      if (frozen_) {
        std::this_thread::sleep_for(10ms);
        continue;
      }
      pollfd fds[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
      if (::poll(fds, 2, 50) <= 0) continue;
      for (int i = 0; i < 2 && open; ++i) {
        if (!fds[i].revents) continue;
        ssize_t n = ::recv(fds[i].fd, buf, sizeof buf, 0);
        open = n > 0 && ::send(fds[1 - i].fd, buf, static_cast<size_t>(n), MSG_NOSIGNAL) == n;
      }
    }
    ::close(server);
    ::close(client);
  }

  int targetPort_;
  std::chrono::milliseconds delay_;
  int listenFd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> frozen_{false};
  std::vector<std::thread> relays_;  // only the acceptor thread adds, and it is joined first
  std::thread acceptor_;
};

}  // namespace

TEST_CASE("store client: a handshake slower than a second still connects", "[store]") {
  SERVE_BOTH();
  // One connection attempt used to be cut off after 50 ms (GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, which
  // is gRPC's minimum connect timeout), and after at most ~1.2 s once gRPC's backoff had grown: a
  // burst of 128 workers connecting to a busy store failed with "cannot connect" (store bootstrap
  // bench). Through a proxy that holds each connection for 1.5 s, the client must still connect.
  TestServer server({}, "127.0.0.1:0", serve);
  TcpRelay proxy(server.port, 1500ms);
  StoreClientOptions o = clientOptions(server);
  o.address = proxy.address();
  o.connectTimeout = 8s;
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<StoreClient> client;
  REQUIRE_NOTHROW(client = std::make_unique<StoreClient>(o));
  CHECK(client->add("through the slow proxy", 1) == 1);
  CHECK(std::chrono::steady_clock::now() - start >= 1500ms);
  client.reset();
}

TEST_CASE("store client: a connection that dies without a word fails its calls within the keepalive", "[store]") {
  SERVE_BOTH();
  // Between a job's bootstrap and its last barrier a worker's store connection idles for hours. If
  // it dies silently meanwhile, the next call must fail in about two keepalives, not hang until its
  // deadline (the store's default timeout is 5 minutes).
  TestServer server({}, "127.0.0.1:0", serve);
  TcpRelay relay(server.port);
  StoreClientOptions o = clientOptions(server);
  o.address = relay.address();
  o.timeout = 60s;
  o.keepalive = 500ms;
  StoreClient client(o);
  REQUIRE(client.add("before", 1) == 1);
  relay.freeze();
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(client.add("after", 1), ddprun::ConnectionError);  // at the deadline it would be a TimeoutError
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK(took < ddprun::test::kSafetyBound);  // the call's deadline is 62 s away
  // The server is fine; a client that reaches it directly carries on.
  StoreClient direct(clientOptions(server));
  CHECK(direct.add("before", 1) == 2);
}

// ---- one client, one Session stream: what the stream adds to the calls above ----

namespace {

// A Store service whose Session reads requests and never answers: a hung server.
class SilentStore final : public ddprun::v1::Store::CallbackService {
  grpc::ServerBidiReactor<ddprun::v1::StoreRequest, ddprun::v1::StoreResponse>* Session(
      grpc::CallbackServerContext*) override {
    struct Reactor final : grpc::ServerBidiReactor<ddprun::v1::StoreRequest, ddprun::v1::StoreResponse> {
      Reactor() { StartRead(&request); }
      void OnReadDone(bool ok) override {
        if (ok) {
          StartRead(&request);
        } else {
          Finish(grpc::Status::OK);
        }
      }
      void OnCancel() override {}
      void OnDone() override { delete this; }
      ddprun::v1::StoreRequest request;
    };
    return new Reactor();
  }
};

}  // namespace

TEST_CASE("store client: many threads on one client get their own answers", "[store][session]") {
  SERVE_BOTH();
  TestServer server({}, "127.0.0.1:0", serve);
  auto o = clientOptions(server);
  o.timeout = 60s;
  StoreClient client(o);
  constexpr int kThreads = 16;
  constexpr int kOps = 100;
  std::atomic<int> wrong{0};
  // One thread blocks on a key that a later thread sets through the same client and stream.
  auto blocked = std::async(std::launch::async, [&] { return client.get("released"); });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string key = "t" + std::to_string(t);
      for (int i = 1; i <= kOps; ++i) {
        if (client.add(key, t + 1) != static_cast<int64_t>(i) * (t + 1)) ++wrong;
        const std::string mine = key + "/" + std::to_string(i);
        if (client.compareSet(key + "c", i == 1 ? "" : key + "/" + std::to_string(i - 1), mine) != mine) ++wrong;
        if (client.get(key + "c") != mine) ++wrong;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(wrong == 0);
  CHECK(blocked.wait_for(0s) == std::future_status::timeout);
  client.set("released", "now");
  REQUIRE(blocked.wait_for(5s) == std::future_status::ready);
  CHECK(blocked.get() == "now");
  CHECK(client.numKeys() == 2 * kThreads + 1);
}

TEST_CASE("store client: too many waits on one client are refused", "[store][session]") {
  SERVE_BOTH();
  ddprun::StoreCoreOptions options;
  options.maxPendingPerConnection = 1;
  TestServer server(options, "127.0.0.1:0", serve);
  StoreClient client(clientOptions(server));
  auto first = std::async(std::launch::async, [&] { client.wait({"a"}); });
  // The first wait is pending once the store has a deadline to watch.
  const auto until = std::chrono::steady_clock::now() + 3s;
  while (!server.core.store().nextDeadline() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(5ms);
  }
  REQUIRE(server.core.store().nextDeadline().has_value());
  // Refused, not timed out (the message says which).
  CHECK_THAT(errorOf([&] { client.wait({"b"}); }), Contains("too many pending store waits"));
  client.set("a", "1");
  first.get();
  // The slot is free again: this wait is accepted, and times out instead of being refused.
  CHECK_THROWS_AS(client.wait({"b"}, 50ms), ddprun::TimeoutError);
}

TEST_CASE("store client: a server that stops mid-call fails it, and the next call reconnects", "[store][session]") {
  SERVE_BOTH();
  auto server = std::make_unique<TestServer>(ddprun::StoreCoreOptions{}, "127.0.0.1:0", serve);
  const std::string address = server->address();
  auto o = clientOptions(*server);
  o.timeout = 30s;
  o.connectTimeout = 3s;
  StoreClient client(o);
  client.set("k", "v");
  auto waiting = std::async(std::launch::async, [&] { return errorOf([&] { client.get("never"); }); });
  const auto until = std::chrono::steady_clock::now() + 3s;
  while (!server->core.store().nextDeadline() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(5ms);
  }
  server.reset();  // service shutdown, then the server's
  REQUIRE(waiting.wait_for(5s) == std::future_status::ready);
  const std::string error = waiting.get();
  CHECK_THAT(error, Contains("store get of 'never'"));
  CHECK_THROWS_AS(client.add("n", 1), ddprun::ConnectionError);  // nobody listens now

  TestServer again({}, address, serve);
  CHECK(client.add("n", 1) == 1);  // a fresh store on the same port, over a new stream
  CHECK(client.numKeys() == 1);
}

TEST_CASE("store client: the call's deadline fires on a server that never answers", "[store][session]") {
  SilentStore silent;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&silent);
  auto server = builder.BuildAndStart();
  REQUIRE(server != nullptr);
  StoreClientOptions o;
  o.address = "127.0.0.1:" + std::to_string(port);
  o.runId = "job";
  o.timeout = 100ms;  // the deadline is this plus the client's 2 s margin
  StoreClient client(o);
  const auto start = std::chrono::steady_clock::now();
  std::string error;
  try {
    client.get("k");
  } catch (const ddprun::TimeoutError& e) {
    error = e.what();
  }
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK_THAT(error, Contains("get of 'k'"));
  CHECK(took >= 2s);
  CHECK(took < ddprun::test::kSafetyBound);  // a safety bound: the deadline is about 2.1 s away
  // The stream was cancelled; the next call opens another one (and times out the same way).
  CHECK_THROWS_AS(client.add("n", 1), ddprun::TimeoutError);
  server->Shutdown(std::chrono::system_clock::now() + 1s);
}
