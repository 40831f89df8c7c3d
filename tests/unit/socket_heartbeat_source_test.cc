// SocketHeartbeatSource: the real worker channel (docs/heartbeat.md). A socket pair per worker
// whose worker end stays CLOEXEC in the agent (the spawn clears it in the child only), the named
// socket for processes that did not inherit their end, oversized messages rejected whole, and an
// old attempt's messages dropped. Real sockets, no processes.
#include "agent/socket_heartbeat_source.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

using ddprun::HeartbeatMessage;
using ddprun::SocketHeartbeatSource;

namespace {

void sendNamed(const std::string& name, const std::string& text) {
  int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, name.data() + 1, name.size() - 1);
  auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
  CHECK(::sendto(fd, text.data(), text.size(), 0, reinterpret_cast<sockaddr*>(&addr), len) ==
        static_cast<ssize_t>(text.size()));
  ::close(fd);
}

// A source of one attempt that keeps every beat it delivers.
struct Source {
  Source() {
    source.setOnBeat([this](const HeartbeatMessage& m) { beats.push_back(m); });
    source.newAttempt({});
  }
  boost::asio::io_context io;
  SocketHeartbeatSource source{io};
  std::vector<HeartbeatMessage> beats;
};

void pump(boost::asio::io_context& io) {
  io.restart();
  while (io.poll() > 0) {
  }
}

}  // namespace

TEST_CASE("socket heartbeat source: a channel per worker, inherited by number, and the named socket beside it",
          "[heartbeat]") {
  Source s;
  auto& [io, source, beats] = s;
  const auto end = source.openChannel(0);
  REQUIRE(end.fd >= 0);
  CHECK((::fcntl(end.fd, F_GETFD) & FD_CLOEXEC) != 0);  // no other child may inherit it
  REQUIRE(end.env.size() == 2);
  CHECK(end.env[0] == std::pair<std::string, std::string>{"DDPRUN_HEARTBEAT_FD", std::to_string(end.fd)});
  CHECK(end.env[1].first == "DDPRUN_HEARTBEAT_SOCKET");
  CHECK(end.env[1].second == source.socketName());

  const std::string good = "3 41 section=ckpt time=0.250000\n";
  CHECK(::send(end.fd, good.data(), good.size(), 0) == static_cast<ssize_t>(good.size()));
  const std::string oversized = "3 42 pad=" + std::string(300, 'p');
  CHECK(::send(end.fd, oversized.data(), oversized.size(), 0) == static_cast<ssize_t>(oversized.size()));
  CHECK(::send(end.fd, "garbage", 7, 0) == 7);
  sendNamed(source.socketName(), "4 7\n");
  pump(io);
  REQUIRE(beats.size() == 2);
  CHECK(beats[0].rank == 3);
  CHECK(beats[0].step == 41);
  CHECK(beats[0].section == "ckpt");
  CHECK(beats[0].stepSeconds == 0.25);
  CHECK(beats[1].rank == 4);

  source.workersSpawned();  // the agent's copy of the worker's end is closed
  CHECK(::fcntl(end.fd, F_GETFD) == -1);
}

TEST_CASE("socket heartbeat source: a new attempt drops what the old one queued, and drain() reads at once",
          "[heartbeat]") {
  Source s;
  auto& [io, source, beats] = s;
  const auto end = source.openChannel(0);
  const int worker = ::fcntl(end.fd, F_DUPFD_CLOEXEC, 3);  // as the worker holds it after the spawn
  source.workersSpawned();
  CHECK(::send(worker, "0 1\n", 4, 0) == 4);
  sendNamed(source.socketName(), "1 1\n");
  source.newAttempt({});  // before the loop read either
  pump(io);
  CHECK(beats.empty());
  CHECK(::send(worker, "0 2\n", 4, MSG_NOSIGNAL) == -1);  // the old attempt's channel is closed

  const auto next = source.openChannel(0);
  CHECK(::send(next.fd, "0 3\n", 4, 0) == 4);
  source.drain();  // without running the loop
  REQUIRE(beats.size() == 1);
  CHECK(beats[0].step == 3);
  ::close(worker);
}

TEST_CASE("socket heartbeat source: a new attempt keeps the channels it is told to keep (warm spares')",
          "[heartbeat][recovery]") {
  Source s;
  auto& [io, source, beats] = s;
  const int spareKey = 1 << 20;
  const auto spare = source.openChannel(spareKey);
  const auto rank = source.openChannel(0);
  const int spareEnd = ::fcntl(spare.fd, F_DUPFD_CLOEXEC, 3);
  const int rankEnd = ::fcntl(rank.fd, F_DUPFD_CLOEXEC, 3);
  source.workersSpawned();
  source.newAttempt({spareKey});
  CHECK(::send(rankEnd, "0 2\n", 4, MSG_NOSIGNAL) == -1);  // the old attempt's rank: closed
  // The spare waits on: its channel still carries beats in, and the agent's notices out.
  CHECK(::send(spareEnd, "7 0\n", 4, MSG_NOSIGNAL) == 4);
  pump(io);
  REQUIRE(beats.size() == 1);
  CHECK(beats[0].rank == 7);
  source.moveChannel(spareKey, 1);  // it became local rank 1
  CHECK(source.sendToWorker(1, "recover round=2"));
  char buf[64] = {};
  CHECK(::recv(spareEnd, buf, sizeof(buf), MSG_DONTWAIT) == 15);
  ::close(spareEnd);
  ::close(rankEnd);
}
