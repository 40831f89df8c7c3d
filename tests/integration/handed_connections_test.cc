// netguard/handed_connections.h: what the front door knows of the connections it handed to gRPC,
// by the "fd:N" of their calls. Real sockets: the numbers and inodes are the kernel's.
#include "netguard/handed_connections.h"

#include <catch2/catch.hpp>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>

using ddprun::HandedConnections;
using ddprun::UniqueFd;
using Then = HandedConnections::Verdict::Then;

namespace {

UniqueFd socketEnd(UniqueFd* other) {
  int pair[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) == 0);
  other->reset(pair[1]);
  return UniqueFd(pair[0]);
}

std::string peer(const UniqueFd& fd) { return "fd:" + std::to_string(fd.get()); }

}  // namespace

TEST_CASE("handed connections: a call's peer string names who connected, and a first authenticated call trusts it",
          "[netguard]") {
  ddprun::AbuseLimits limits;
  HandedConnections handed(limits, 200);
  const auto now = HandedConnections::Clock::now();
  UniqueFd otherA, otherB;
  UniqueFd a = handed.add(socketEnd(&otherA), "192.0.2.1", 7, false, now);
  UniqueFd b = handed.add(socketEnd(&otherB), "192.0.2.2", 0, false, now);
  CHECK(a.get() >= 200);  // renumbered from the cursor, above the first number
  CHECK(b.get() > a.get());  // not the lowest free number: the cursor goes on
  CHECK(handed.address(peer(a)) == "192.0.2.1");
  CHECK(handed.address(peer(b)) == "192.0.2.2");
  CHECK(handed.address("ipv4:127.0.0.1:5") == "");
  auto v = handed.admit(peer(a), true, now);
  CHECK(v.admitted);
  CHECK(v.then == Then::kTrust);
  CHECK(v.relayId == 7);
  CHECK(handed.admit(peer(a), true, now).then == Then::kNothing);  // trusted once
  CHECK(handed.admit(peer(b), true, now).then == Then::kNothing);  // not relayed: nothing to trust
  CHECK(handed.admit("fd:99999", false, now).admitted);  // unknown: admitted
  CHECK(handed.open() == 2);
  b.reset();  // gRPC closed it
  CHECK(handed.open() == 1);
  CHECK(handed.address(peer(a)) == "192.0.2.1");
}

TEST_CASE("handed connections: the first call over the budget cuts the connection, once", "[netguard]") {
  ddprun::AbuseLimits limits;
  limits.callBurst = 3;
  limits.callsPerSecond = 1;
  HandedConnections handed(limits, 200);
  const auto now = HandedConnections::Clock::now();
  UniqueFd otherA, otherB;
  UniqueFd a = handed.add(socketEnd(&otherA), "192.0.2.1", 5, false, now);
  UniqueFd b = handed.add(socketEnd(&otherB), "192.0.2.2", 0, false, now);
  for (int i = 0; i < 3; ++i) CHECK(handed.admit(peer(a), true, now).admitted);
  auto v = handed.admit(peer(a), true, now);
  CHECK_FALSE(v.admitted);
  CHECK(v.then == Then::kCut);
  CHECK(v.relayId == 5);
  CHECK(v.address == "192.0.2.1");
  CHECK_FALSE(v.why.empty());
  v = handed.admit(peer(a), true, now);
  CHECK_FALSE(v.admitted);
  CHECK(v.then == Then::kNothing);  // cut once
  // An unrelayed connection is shut down here: its other end sees the end.
  for (int i = 0; i < 4; ++i) handed.admit(peer(b), true, now);
  char byte;
  CHECK(::recv(otherB.get(), &byte, 1, MSG_DONTWAIT) == 0);
}

TEST_CASE("handed connections: on probation, a connection is never trusted by its calls", "[netguard]") {
  ddprun::AbuseLimits limits;
  HandedConnections handed(limits, 200);
  const auto now = HandedConnections::Clock::now();
  UniqueFd other;
  UniqueFd a = handed.add(socketEnd(&other), "192.0.2.9", 3, true, now);
  const auto v = handed.admit(peer(a), true, now);
  CHECK(v.admitted);
  CHECK(v.then == Then::kNothing);
}
