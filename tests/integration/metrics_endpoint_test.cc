// The metrics port with real sockets on loopback (port 0) and a plain-socket HTTP client: scrapes,
// probes, errors, a port in use, IPv6, idle connections and their bound, a quick stop, and
// promtool's check of the exposition.
#include "metrics/metrics_endpoint.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <prometheus/counter.h>
#include <prometheus/registry.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/unique_fd.h"
#include "metrics/process_collector.h"
#include "safety_bound.h"
#include "test_skip.h"
#include "test_util.h"

using ddprun::MetricsEndpoint;
using ddprun::UniqueFd;

namespace {

const std::vector<std::string> kProcessMetrics = {
    "process_resident_memory_bytes", "process_virtual_memory_bytes", "process_open_fds", "process_max_fds",
    "process_cpu_seconds_total",     "process_start_time_seconds",   "ddprun_process_threads"};

// Loopback, IPv4 or IPv6.
UniqueFd connectTo(int port, int family = AF_INET) {
  UniqueFd fd(::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(fd);
  sockaddr_in v4{};
  v4.sin_family = AF_INET;
  v4.sin_port = htons(static_cast<uint16_t>(port));
  v4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  sockaddr_in6 v6{};
  v6.sin6_family = AF_INET6;
  v6.sin6_port = htons(static_cast<uint16_t>(port));
  v6.sin6_addr = in6addr_loopback;
  const bool ipv6 = family == AF_INET6;
  REQUIRE(::connect(fd.get(), ipv6 ? reinterpret_cast<sockaddr*>(&v6) : reinterpret_cast<sockaddr*>(&v4),
                    ipv6 ? sizeof(v6) : sizeof(v4)) == 0);
  return fd;
}

// A connection to the loopback port from `source` (127.0.0.x), so that the server sees another
// client address than the probes' 127.0.0.1.
UniqueFd connectFrom(const char* source, int port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return {};
  sockaddr_in from{};
  from.sin_family = AF_INET;
  ::inet_pton(AF_INET, source, &from.sin_addr);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0 ||
      ::connect(fd.get(), reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0)
    return {};
  return fd;
}

// Whether the server closed `fd` (end of stream or reset), waiting up to the safety bound; what it
// sent before is dropped.
bool closedByServer(int fd) {
  const auto deadline = std::chrono::steady_clock::now() + ddprun::test::kSafetyBound;
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char buf[4096];
    if (::recv(fd, buf, sizeof(buf), 0) <= 0) return true;
  }
  return false;
}

// Whether the server still holds `fd` open: nothing to read on it right now.
bool heldOpen(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 0;
}

struct Response {
  int status = 0;
  std::string head;  // status line and headers
  std::string body;
};

// Sends `text`, then reads everything the server sends until it closes (it never keeps
// connections). nullopt: closed without an answer (the connection bound).
std::optional<Response> tryRawRequest(int port, const std::string& text, int family = AF_INET) {
  UniqueFd fd = connectTo(port, family);
  if (::send(fd.get(), text.data(), text.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(text.size())) return std::nullopt;
  std::string in;
  const auto deadline = std::chrono::steady_clock::now() + ddprun::test::kSafetyBound;
  for (;;) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    pollfd p{fd.get(), POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char buf[65536];
    const ssize_t n = ::recv(fd.get(), buf, sizeof(buf), 0);
    if (n <= 0) break;
    in.append(buf, static_cast<std::size_t>(n));
  }
  if (in.empty()) return std::nullopt;
  Response r;
  const auto split = in.find("\r\n\r\n");
  REQUIRE(split != std::string::npos);
  r.head = in.substr(0, split);
  r.body = in.substr(split + 4);
  REQUIRE(r.head.rfind("HTTP/1.1 ", 0) == 0);
  r.status = std::stoi(r.head.substr(9, 3));
  return r;
}

std::string requestText(const std::string& method, const std::string& path) {
  return method + " " + path + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
}

std::optional<Response> tryRequest(int port, const std::string& method, const std::string& path) {
  return tryRawRequest(port, requestText(method, path));
}

Response request(int port, const std::string& method, const std::string& path, int family = AF_INET) {
  auto r = tryRawRequest(port, requestText(method, path), family);
  REQUIRE(r);
  return *r;
}

// Probes /healthz until it is answered (a connection past the bound is closed unanswered while
// the server has not yet seen the others go); false when the safety bound passed first.
bool probeAnswered(int port) {
  const auto deadline = std::chrono::steady_clock::now() + ddprun::test::kSafetyBound;
  while (std::chrono::steady_clock::now() < deadline) {
    if (const auto r = tryRequest(port, "GET", "/healthz")) return r->status == 200;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

bool ipv6LoopbackWorks() {
  UniqueFd fd(::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in6 addr{};
  addr.sin6_family = AF_INET6;
  addr.sin6_addr = in6addr_loopback;
  return fd && ::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
}

}  // namespace

TEST_CASE("metrics endpoint: /metrics serves the registered collectables and the process metrics") {
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::BuildCounter().Name("ddprun_test_events_total").Help("Events in the test.").Register(*registry).Add({}).Increment(3);
  auto gone = std::make_shared<prometheus::Registry>();  // its owner drops it before the scrape
  prometheus::BuildCounter().Name("ddprun_test_gone_total").Help("Gone.").Register(*gone).Add({});
  auto process = std::make_shared<ddprun::ProcessCollector>();
  MetricsEndpoint endpoint({}, {registry, gone, process});
  gone.reset();
  REQUIRE(endpoint.port() > 0);
  CHECK(endpoint.address() == "127.0.0.1:" + std::to_string(endpoint.port()));

  const Response r = request(endpoint.port(), "GET", "/metrics");
  CHECK(r.status == 200);
  CHECK(r.head.find("Content-Type: text/plain; version=0.0.4; charset=utf-8") != std::string::npos);
  CHECK(r.body.find("\nddprun_test_events_total 3") != std::string::npos);
  CHECK(r.body.find("ddprun_test_gone_total") == std::string::npos);
  for (const auto& name : kProcessMetrics) CHECK(r.body.find("\n" + name + " ") != std::string::npos);

  const Response head = request(endpoint.port(), "HEAD", "/metrics");
  CHECK(head.status == 200);
  CHECK(head.body.empty());
  CHECK(head.head.find("Content-Length: 0") == std::string::npos);
}

TEST_CASE("metrics endpoint: /healthz, /readyz as readiness says, 404 and 405") {
  std::atomic<bool> ready{true};
  MetricsEndpoint endpoint({}, {}, [&] { return ready.load(); });
  const int port = endpoint.port();
  CHECK(request(port, "GET", "/healthz").body == "ok\n");
  Response r = request(port, "GET", "/readyz");
  CHECK((r.status == 200 && r.body == "ready\n"));
  ready = false;
  r = request(port, "GET", "/readyz");
  CHECK((r.status == 503 && r.body == "not ready\n"));
  CHECK(request(port, "GET", "/healthz").status == 200);  // alive, though not ready
  CHECK(request(port, "GET", "/nope").status == 404);
  CHECK(request(port, "GET", "/metrics/x").status == 404);
  r = request(port, "POST", "/metrics");
  CHECK(r.status == 405);
  CHECK(r.head.find("Allow: GET, HEAD") != std::string::npos);
  CHECK(request(port, "DELETE", "/healthz").status == 405);
  CHECK(request(port, "PROPFIND", "/readyz").status == 405);  // no common method either
  // A body is never read: the answer comes from the headers.
  const auto withBody = tryRawRequest(port, "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello");
  REQUIRE(withBody);
  CHECK(withBody->status == 405);
  const auto garbage = tryRawRequest(port, "this is not HTTP\r\n\r\n");
  REQUIRE(garbage);
  CHECK(garbage->status == 400);
  CHECK(request(port, "GET", "/healthz?verbose=1").status == 200);  // the query is not the path
}

TEST_CASE("metrics endpoint: a port in use or bad options are one clear ConfigError, nothing printed") {
  MetricsEndpoint first({}, {});
  MetricsEndpoint::Options options;
  options.port = first.port();
  ddprun::test::OutputCapture err(2), out(1);
  const std::string where = "cannot serve metrics on 127.0.0.1:" + std::to_string(first.port());
  CHECK_THROWS_MATCHES(MetricsEndpoint(options, {}), ddprun::ConfigError,
                       Catch::Matchers::Message(where + ": address already in use"));
  options.port = 70000;
  CHECK_THROWS_MATCHES(MetricsEndpoint(options, {}), ddprun::ConfigError,
                       Catch::Matchers::Message("cannot serve metrics on 127.0.0.1:70000: port out of range"));
  options.port = 0;
  options.maxConnections = 0;
  CHECK_THROWS_AS(MetricsEndpoint(options, {}), ddprun::ConfigError);
  const std::string printed = err.text() + out.text();
  err.restore();
  out.restore();
  CHECK(printed.empty());
}

TEST_CASE("metrics endpoint: serves on IPv6 loopback") {
  if (!ipv6LoopbackWorks()) DDPRUN_SKIP("this machine has no IPv6 on loopback (::1 cannot be bound)");
  MetricsEndpoint::Options options;
  options.bindAddress = "::1";
  MetricsEndpoint endpoint(options, {});
  CHECK(endpoint.address() == "[::1]:" + std::to_string(endpoint.port()));
  const Response r = request(endpoint.port(), "GET", "/healthz", AF_INET6);
  CHECK((r.status == 200 && r.body == "ok\n"));
}

TEST_CASE("metrics endpoint: idle connections do not delay a probe") {
  MetricsEndpoint::Options options;
  options.maxConnections = 128;
  options.maxConnectionsPerAddress = 128;  // no eviction: this case is about waiting, not room
  options.requestTimeout = std::chrono::minutes(10);  // far beyond the safety bound: never waited for
  MetricsEndpoint endpoint(options, {});
  // 64 connections that never send a byte. A server with a thread per connection answers the
  // probe behind them only as their timeouts pass; this one at once.
  std::vector<UniqueFd> idle;
  for (int i = 0; i < 64; ++i) idle.push_back(connectTo(endpoint.port()));
  const auto start = std::chrono::steady_clock::now();
  const Response r = request(endpoint.port(), "GET", "/healthz");
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK(r.status == 200);
  CHECK(took < ddprun::test::kSafetyBound);
  for (const auto& fd : idle) CHECK(heldOpen(fd.get()));  // still waiting for their requests
}

TEST_CASE("metrics endpoint: a connection that sends no request is closed after the request timeout") {
  MetricsEndpoint::Options options;
  options.maxConnections = 1;
  options.requestTimeout = std::chrono::milliseconds(200);
  MetricsEndpoint endpoint(options, {});
  UniqueFd idle = connectTo(endpoint.port());
  // It holds the only place until its timeout; then the server closes it and a probe gets through.
  CHECK(closedByServer(idle.get()));
  CHECK(probeAnswered(endpoint.port()));
}

TEST_CASE("metrics endpoint: at maxConnections a new connection takes the place of the oldest idle one") {
  MetricsEndpoint::Options options;
  options.maxConnections = 4;
  options.maxConnectionsPerAddress = 4;
  options.requestTimeout = std::chrono::minutes(10);
  MetricsEndpoint endpoint(options, {});
  std::vector<UniqueFd> idle;
  for (int i = 0; i < 4; ++i) idle.push_back(connectTo(endpoint.port()));
  REQUIRE(probeAnswered(endpoint.port()));  // in at once: it took the place of the oldest
  CHECK(closedByServer(idle[0].get()));
  for (std::size_t i = 1; i < idle.size(); ++i) CHECK(heldOpen(idle[i].get()));
  // The probe has gone, leaving a free place: of two more idle newcomers the second evicts the
  // next oldest.
  idle.push_back(connectTo(endpoint.port()));
  idle.push_back(connectTo(endpoint.port()));
  CHECK(closedByServer(idle[1].get()));
  for (std::size_t i = 2; i < idle.size(); ++i) CHECK(heldOpen(idle[i].get()));
  CHECK(probeAnswered(endpoint.port()));
}

TEST_CASE("metrics endpoint: a connection whose request is in is never evicted") {
  // A scrape whose answer the client does not read holds its place until the request timeout;
  // when every place is being answered, a newcomer is closed at once. The answer (about 5 MB)
  // outgrows loopback's largest send buffer (4 MiB) and the reader's small receive window.
  prometheus::Registry registry;
  auto& family = prometheus::BuildCounter().Name("ddprun_test_big_total").Help("x").Register(registry);
  for (int i = 0; i < 150000; ++i) family.Add({{"n", std::to_string(i)}}).Increment();
  auto shared = std::shared_ptr<prometheus::Registry>(&registry, [](auto*) {});
  MetricsEndpoint::Options options;
  options.maxConnections = 2;
  options.maxConnectionsPerAddress = 2;
  options.requestTimeout = std::chrono::minutes(10);
  MetricsEndpoint endpoint(options, {shared});
  std::vector<UniqueFd> readers;  // ask for megabytes, never read them: the answer's write waits
  for (int i = 0; i < 2; ++i) {
    UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    int small = 4096;
    REQUIRE(::setsockopt(fd.get(), SOL_SOCKET, SO_RCVBUF, &small, sizeof(small)) == 0);  // before connect: the window
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(static_cast<uint16_t>(endpoint.port()));
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd.get(), reinterpret_cast<sockaddr*>(&to), sizeof(to)) == 0);
    const std::string text = requestText("GET", "/metrics");
    REQUIRE(::send(fd.get(), text.data(), text.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(text.size()));
    readers.push_back(std::move(fd));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));  // both requests are in and answering
  CHECK_FALSE(tryRequest(endpoint.port(), "GET", "/healthz"));
  for (const auto& fd : readers) {
    pollfd p{fd.get(), POLLIN, 0};
    REQUIRE(::poll(&p, 1, 0) == 1);
    char buf[16];
    CHECK(::recv(fd.get(), buf, sizeof(buf), MSG_PEEK) > 0);  // being answered, not closed
  }
  readers.pop_back();  // one reader goes: its place is free again
  CHECK(probeAnswered(endpoint.port()));
}

TEST_CASE("metrics endpoint: one address holds at most its share, and a newcomer from it evicts its own oldest") {
  MetricsEndpoint::Options options;
  options.maxConnections = 8;  // 4 per address: half
  options.requestTimeout = std::chrono::minutes(10);
  MetricsEndpoint endpoint(options, {});
  std::vector<UniqueFd> others;
  for (int i = 0; i < 4; ++i) others.push_back(connectFrom("127.0.0.3", endpoint.port()));
  std::vector<UniqueFd> flood;
  for (int i = 0; i < 6; ++i) flood.push_back(connectFrom("127.0.0.2", endpoint.port()));
  CHECK(closedByServer(flood[0].get()));  // the flood's two oldest gave way to its own newcomers
  CHECK(closedByServer(flood[1].get()));
  for (std::size_t i = 2; i < flood.size(); ++i) CHECK(heldOpen(flood[i].get()));
  for (const auto& fd : others) CHECK(heldOpen(fd.get()));  // never the other address's
  CHECK(probeAnswered(endpoint.port()));  // 127.0.0.1: a free place (4 + 4 of 8: evicts the oldest)
}

namespace {

// Issue #37 item 4's attack: `count` connections from `source` that never send a byte, each
// opened again as soon as the server closes it, until stopped. Bounded: one thread, a 5 ms poll.
class SilentFlood {
 public:
  SilentFlood(const char* source, int port, int count) : source_(source), port_(port) {
    for (int i = 0; i < count; ++i) fds_.push_back(connectFrom(source_, port_));
    thread_ = std::thread([this] { run(); });
  }
  ~SilentFlood() {
    stop_ = true;
    thread_.join();
  }
  int reopened() const { return reopened_; }

 private:
  void run() {
    while (!stop_) {
      std::vector<pollfd> polled;
      for (const auto& fd : fds_) polled.push_back({fd.get(), POLLIN, 0});
      ::poll(polled.data(), polled.size(), 5);
      for (std::size_t i = 0; i < fds_.size(); ++i) {
        if (fds_[i] && !(polled[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        fds_[i] = connectFrom(source_, port_);  // closed by the server (or never opened): again
        ++reopened_;
      }
    }
  }

  const char* source_;
  int port_;
  std::vector<UniqueFd> fds_;
  std::atomic<bool> stop_{false};
  std::atomic<int> reopened_{0};
  std::thread thread_;
};

// GET /healthz from 127.0.0.1, answered 200 within `within` (a kubelet probe's default timeout is
// 1 s); a connection closed unanswered or a late answer is a failed probe.
bool probeWithin(int port, std::chrono::milliseconds within) {
  const auto deadline = std::chrono::steady_clock::now() + within;
  UniqueFd fd = connectFrom("127.0.0.1", port);
  if (!fd) return false;
  const std::string text = requestText("GET", "/healthz");
  if (::send(fd.get(), text.data(), text.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(text.size())) return false;
  std::string in;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd.get(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::recv(fd.get(), buf, sizeof(buf), 0);
    if (n <= 0) break;
    in.append(buf, static_cast<std::size_t>(n));
  }
  return in.rfind("HTTP/1.1 200 ", 0) == 0;
}

}  // namespace

TEST_CASE("metrics endpoint: probes are answered while silent connections fill the cap and reopen as they close") {
  // Issue #37 item 4, bounded: the daemon's options (64 connections, 2 s for a request), 64 silent
  // connections reopened as they close for 3 s, one /healthz probe every 50 ms. Before eviction
  // 2 of 80 probes were answered.
  const char* source = GENERATE("127.0.0.2", "127.0.0.1");  // another address, and the probes' own
  CAPTURE(source);
  MetricsEndpoint::Options options;
  options.requestTimeout = std::chrono::milliseconds(2000);
  MetricsEndpoint endpoint(options, {});
  SilentFlood flood(source, endpoint.port(), 64);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the flood holds its places
  int sent = 0;
  int answered = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (std::chrono::steady_clock::now() < end) {
    const auto next = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
    ++sent;
    if (probeWithin(endpoint.port(), std::chrono::milliseconds(1000))) ++answered;
    std::this_thread::sleep_until(next);
  }
  INFO(answered << " of " << sent << " probes answered; the flood reopened " << flood.reopened() << " connections");
  CHECK(answered * 100 >= sent * 95);
}

TEST_CASE("metrics endpoint: stops at once, with idle and half-sent requests open") {
  MetricsEndpoint::Options options;
  options.requestTimeout = std::chrono::minutes(10);
  auto endpoint = std::make_unique<MetricsEndpoint>(options, std::vector<std::weak_ptr<prometheus::Collectable>>{});
  std::vector<UniqueFd> idle;
  for (int i = 0; i < 10; ++i) idle.push_back(connectTo(endpoint->port()));
  const std::string half = "GET /metrics HTTP/1.1\r\nHost: x\r\n";  // the blank line never comes
  REQUIRE(::send(idle.back().get(), half.data(), half.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(half.size()));
  REQUIRE(probeAnswered(endpoint->port()));  // the server has taken them all in
  const auto start = std::chrono::steady_clock::now();
  endpoint.reset();
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK(took < ddprun::test::kSafetyBound);  // not the 10 min request timeout
  for (const auto& fd : idle) CHECK(closedByServer(fd.get()));
}

TEST_CASE("metrics endpoint: the exposition passes promtool check metrics") {
  const std::string promtool = "/usr/bin/promtool";
  if (!std::filesystem::exists(promtool)) DDPRUN_SKIP("promtool is not installed (Debian package prometheus)");
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::BuildCounter().Name("ddprun_test_events_total").Help("Events in the test.").Register(*registry).Add({});
  auto process = std::make_shared<ddprun::ProcessCollector>();
  MetricsEndpoint endpoint({}, {registry, process});
  const Response r = request(endpoint.port(), "GET", "/metrics");
  REQUIRE(r.status == 200);
  ddprun::test::TempDir dir;
  ddprun::test::writeFile(dir.file("scrape.txt"), r.body);
  std::FILE* pipe = ::popen((promtool + " check metrics < " + dir.file("scrape.txt") + " 2>&1").c_str(), "r");
  REQUIRE(pipe);
  std::string output;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof(buf), pipe)) > 0;) output.append(buf, n);
  const int status = ::pclose(pipe);
  INFO("promtool said: " << output);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(output.empty());
}

TEST_CASE("process collector: plausible values from /proc, and an unreadable /proc gives no samples") {
  const auto families = ddprun::ProcessCollector().Collect();
  REQUIRE(families.size() == kProcessMetrics.size());
  for (const auto& family : families) {
    INFO(family.name);
    REQUIRE(family.metric.size() == 1);
    const double value = family.type == prometheus::MetricType::Counter ? family.metric[0].counter.value
                                                                         : family.metric[0].gauge.value;
    CHECK(value >= 0);
    if (family.name != "process_cpu_seconds_total") CHECK(value > 0);
  }
  CHECK(ddprun::ProcessCollector("/nonexistent-proc").Collect().empty());
}
