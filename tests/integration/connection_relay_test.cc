// The connection relay with real sockets (socket pairs stand in for the client's TCP connection;
// no gRPC): bytes pass both ways unchanged and in order, large transfers fill the bounded buffers
// without loss, half-closes pass through, and a flood of streams cuts the connection.
#include "netguard/connection_relay.h"
#include "netguard/http2_frames.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "common/http2_refusal.h"
#include "relay_test_util.h"

using ddprun::AbuseLimits;
using ddprun::ConnectionRelay;
using ddprun::UniqueFd;

using ddprun::test::frame;
using ddprun::test::kPreface;
using ddprun::test::makePair;
using ddprun::test::Pair;
using ddprun::test::readUpTo;
using ddprun::test::writeAll;

TEST_CASE("the relay passes bytes both ways in order, larger than its buffers, and passes half-closes",
          "[rendezvous][relay]") {
  ConnectionRelay relay(AbuseLimits{}, {}, nullptr);
  Pair client = makePair();
  auto added = relay.add(std::move(client.relay), "192.0.2.9", true);
  REQUIRE(added.grpcSide);
  const int server = added.grpcSide.get();
  ::fcntl(server, F_SETFL, ::fcntl(server, F_GETFL) & ~O_NONBLOCK);  // gRPC's side is non-blocking

  // 4 MiB of DATA frames each way at once: both directions fill the relay's 256 KiB buffers.
  std::string up = kPreface + frame(0x1, 1, 20);
  while (up.size() < (4u << 20)) up += frame(0x0, 1, 16000);
  std::string down;
  while (down.size() < (4u << 20)) down += std::to_string(down.size()) + ",";
  std::atomic<bool> upOk{false}, downOk{false};
  std::thread writer([&] { upOk = writeAll(client.test.get(), up); });
  std::thread serverWriter([&] { downOk = writeAll(server, down); });
  std::string atServer = readUpTo(server, up.size());
  std::string atClient = readUpTo(client.test.get(), down.size());
  writer.join();
  serverWriter.join();
  CHECK(upOk);
  CHECK(downOk);
  CHECK(atServer == up);
  CHECK(atClient == down);

  // The client ends its writing: the server reads EOF, and can still answer.
  ::shutdown(client.test.get(), SHUT_WR);
  bool eof = false;
  CHECK(readUpTo(server, 1, &eof).empty());
  CHECK(eof);
  CHECK(writeAll(server, "last words"));
  CHECK(readUpTo(client.test.get(), 10) == "last words");
  ::shutdown(server, SHUT_WR);
  eof = false;
  readUpTo(client.test.get(), 1, &eof);
  CHECK(eof);
  CHECK(relay.stats().relayed == 1);
}

TEST_CASE("the GOAWAY of a cut names the last stream that reached gRPC", "[rendezvous][relay]") {
  // A client's library sends again only the streams above the GOAWAY's last stream: 0 (as the
  // relay sent) told it that calls gRPC had processed were not, an Add done twice.
  AbuseLimits limits;
  limits.callBurst = 10;
  limits.callsPerSecond = 1;
  ConnectionRelay relay(limits, {}, nullptr);
  Pair client = makePair();
  auto added = relay.add(std::move(client.relay), "192.0.2.67", true);
  REQUIRE(added.grpcSide);
  const std::string first = kPreface + frame(0x1, 1, 12) + frame(0x1, 3, 12) + frame(0x1, 5, 12);
  REQUIRE(writeAll(client.test.get(), first));
  CHECK(readUpTo(added.grpcSide.get(), first.size()).size() == first.size());  // they reached gRPC
  std::string flood;
  for (uint32_t s = 7; s < 2000; s += 2) flood += frame(0x1, s, 12) + frame(0x3, s, 4);
  CHECK(::send(client.test.get(), flood.data(), flood.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(flood.size()));
  bool eof = false;
  const std::string told = readUpTo(client.test.get(), 1 << 20, &eof);
  CHECK(eof);
  REQUIRE(told.size() >= 13);
  CHECK(ddprun::goAwayReason(told).has_value());
  const auto* p = reinterpret_cast<const unsigned char*>(told.data() + 9);
  CHECK(((uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3]) == 5);
}

TEST_CASE("the relay cuts a connection that opens streams faster than allowed, before passing them on",
          "[rendezvous][relay]") {
  AbuseLimits limits;
  limits.callBurst = 10;
  limits.callsPerSecond = 1;
  std::mutex mu;
  std::string offender, reason;
  ConnectionRelay relay(limits, {}, [&](const std::string& address, const std::string& why) {
    std::lock_guard<std::mutex> lock(mu);
    offender = address;
    reason = why;
  });
  Pair client = makePair();
  auto added = relay.add(std::move(client.relay), "192.0.2.66", true);
  REQUIRE(added.grpcSide);
  std::string flood = kPreface;
  for (uint32_t s = 1; s < 2000; s += 2) flood += frame(0x1, s, 12) + frame(0x3, s, 4);  // rapid reset
  // One write that fits the socket's buffer; MSG_NOSIGNAL: the relay may cut the connection first.
  CHECK(::send(client.test.get(), flood.data(), flood.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(flood.size()));
  bool eof = false;
  const std::string passed = readUpTo(added.grpcSide.get(), flood.size(), &eof);
  CHECK(eof);                            // the server side saw the connection end
  CHECK(passed.size() < flood.size());   // and never got the flood
  eof = false;
  // The client's connection is closed, and it was told why first (a GOAWAY naming the limit:
  // the server had sent nothing, so a frame may go first).
  const std::string told = readUpTo(client.test.get(), 1 << 20, &eof);
  CHECK(eof);
  CHECK(ddprun::goAwayReason(told) ==
        std::optional<std::string>("ddprun-rdzv closed the connection: it opened streams faster than allowed"));
  // Its last stream is the highest that reached gRPC (those may have been processed: a client
  // that read 0 would send them again, an Add done twice), and no higher (those above it the
  // client may send again on a new connection: gRPC never saw them).
  REQUIRE(told.size() >= 13);
  const auto* p = reinterpret_cast<const unsigned char*>(told.data() + 9);
  const uint32_t lastStream = (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
  ddprun::Http2FrameScanner reached;
  reached.feed(passed.data(), passed.size());
  CHECK(lastStream == reached.highestStream());
  // onAbuse runs on the relay's thread just after it closed the connection.
  const auto deadline = std::chrono::steady_clock::now() + ddprun::test::kSafetyBound;
  while (std::chrono::steady_clock::now() < deadline) {
    std::lock_guard<std::mutex> lock(mu);
    if (!offender.empty()) break;
  }
  std::lock_guard<std::mutex> lock(mu);
  CHECK(offender == "192.0.2.66");
  CHECK(reason == "opened streams faster than allowed");
  CHECK(relay.stats().closedForAbuse == 1);
  CHECK(relay.stats().open == 0);
}

TEST_CASE("close() cuts a relayed connection from another thread", "[rendezvous][relay]") {
  ConnectionRelay relay(AbuseLimits{}, {}, nullptr);
  Pair client = makePair();
  auto added = relay.add(std::move(client.relay), "192.0.2.7", true);
  REQUIRE(added.grpcSide);
  CHECK(writeAll(client.test.get(), kPreface));
  CHECK(readUpTo(added.grpcSide.get(), kPreface.size()) == kPreface);
  relay.close(added.id);
  bool eof = false;
  readUpTo(client.test.get(), 1, &eof);
  CHECK(eof);
  eof = false;
  readUpTo(added.grpcSide.get(), 1, &eof);
  CHECK(eof);
  relay.close(added.id);  // twice, or unknown: ignored
  relay.close(12345);
}

TEST_CASE("an untrusted connection may open only a few streams until trust(), then its full burst",
          "[rendezvous][relay]") {
  AbuseLimits limits;
  limits.untrustedCallBurst = 4;
  limits.callBurst = 50;
  limits.callsPerSecond = 0.001;
  ConnectionRelay relay(limits, {}, nullptr);

  // Untrusted: the fifth stream cuts the connection.
  Pair cut = makePair();
  auto first = relay.add(std::move(cut.relay), "192.0.2.10", false);
  std::string five = kPreface;
  for (uint32_t s = 1; s <= 9; s += 2) five += frame(0x1, s, 8);
  CHECK(::send(cut.test.get(), five.data(), five.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(five.size()));
  bool eof = false;
  // Told why (a GOAWAY naming the limit), then closed.
  const std::string told = readUpTo(cut.test.get(), 1 << 20, &eof);
  CHECK(eof);
  CHECK(ddprun::goAwayReason(told) ==
        std::optional<std::string>("ddprun-rdzv closed the connection: it opened streams faster than allowed"));

  // Trusted after its first stream: forty more pass.
  Pair ok = makePair();
  auto second = relay.add(std::move(ok.relay), "192.0.2.11", false);
  const std::string opening = kPreface + frame(0x1, 1, 8);
  CHECK(writeAll(ok.test.get(), opening));
  CHECK(readUpTo(second.grpcSide.get(), opening.size()) == opening);
  relay.trust(second.id);
  std::string more;
  for (uint32_t s = 3; s < 83; s += 2) more += frame(0x1, s, 8);
  // The relay applies requests before the bytes that were sent after them.
  CHECK(writeAll(ok.test.get(), more));
  CHECK(readUpTo(second.grpcSide.get(), more.size()) == more);
}
