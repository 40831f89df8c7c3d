// The metrics port with real sockets on loopback (port 0) and a plain-socket HTTP client: scrapes,
// probes, errors, a port in use, idle connections, and promtool's check of the exposition.
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
#include <string>
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

UniqueFd connectTo(int port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(fd);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  return fd;
}

struct Response {
  int status = 0;
  std::string head;  // status line and headers
  std::string body;
};

// One request, then everything the server sends until it closes (it never keeps connections).
Response request(int port, const std::string& method, const std::string& path) {
  UniqueFd fd = connectTo(port);
  const std::string text = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  REQUIRE(::send(fd.get(), text.data(), text.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(text.size()));
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
  Response r;
  const auto split = in.find("\r\n\r\n");
  REQUIRE(split != std::string::npos);
  r.head = in.substr(0, split);
  r.body = in.substr(split + 4);
  REQUIRE(r.head.rfind("HTTP/1.1 ", 0) == 0);
  r.status = std::stoi(r.head.substr(9, 3));
  return r;
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
  CHECK(request(port, "PROPFIND", "/readyz").status == 405);  // beyond the methods CivetHandler knows
}

TEST_CASE("metrics endpoint: a port in use or an IPv6 address is one clear ConfigError, nothing printed") {
  MetricsEndpoint first({}, {});
  MetricsEndpoint::Options options;
  options.port = first.port();
  ddprun::test::OutputCapture err(2), out(1);
  const std::string where = "cannot serve metrics on 127.0.0.1:" + std::to_string(first.port());
  CHECK_THROWS_MATCHES(MetricsEndpoint(options, {}), ddprun::ConfigError,
                       Catch::Matchers::Message(where + ": address already in use"));
  // Debian 12's civetweb has no IPv6; one built with it serves "::1".
  options.bindAddress = "::1";
  options.port = 0;
  try {
    MetricsEndpoint v6(options, {});
    CHECK(v6.address() == "[::1]:" + std::to_string(v6.port()));
  } catch (const ddprun::ConfigError& e) {
    CHECK_THAT(e.what(), Catch::Matchers::StartsWith("cannot serve metrics on [::1]:0: this civetweb (") &&
                             Catch::Matchers::EndsWith(") is built without IPv6; use an IPv4 address"));
  }
  const std::string printed = err.text() + out.text();
  err.restore();
  out.restore();
  CHECK(printed.empty());
}

TEST_CASE("metrics endpoint: idle connections are cut after the request timeout, so a probe gets through") {
  MetricsEndpoint::Options options;
  options.requestTimeout = std::chrono::milliseconds(200);
  MetricsEndpoint endpoint(options, {});
  // 64 connections that never send a byte: each holds one of the 2 workers for 200 ms, so the
  // probe behind them is answered after about 64 / 2 * 200 ms = 6.4 s, far inside the bound.
  std::vector<UniqueFd> idle;
  for (int i = 0; i < 64; ++i) idle.push_back(connectTo(endpoint.port()));
  const auto start = std::chrono::steady_clock::now();
  const Response r = request(endpoint.port(), "GET", "/healthz");
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK(r.status == 200);
  CHECK(took < ddprun::test::kSafetyBound);
  // The first idle connection was served its timeout and closed by the server.
  char buf[512];
  pollfd p{idle.front().get(), POLLIN, 0};
  REQUIRE(::poll(&p, 1, 0) == 1);
  while (::recv(idle.front().get(), buf, sizeof(buf), MSG_DONTWAIT) > 0) {}
  CHECK(::recv(idle.front().get(), buf, sizeof(buf), MSG_DONTWAIT) == 0);
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
