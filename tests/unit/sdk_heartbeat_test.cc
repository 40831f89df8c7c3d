// Heartbeat: "RANK STEP\n" messages on the inherited channel, or datagrams to the agent's unix
// socket (abstract '@' names or paths); nothing without either, and never an error when nobody
// listens. The bytes of each message: heartbeat_grammar_test.cc.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <random>
#include <string>
#include <thread>

#include "test_util.h"
#include "worker_sdk/heartbeat.h"

namespace {

// A bound unix datagram socket standing in for the agent's hang detector.
class Listener {
 public:
  explicit Listener(const std::string& name) {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd_ >= 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, name.data(), name.size());
    socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
    if (name[0] == '@') {
      addr.sun_path[0] = '\0';
    } else {
      ++len;  // the path's terminating NUL
    }
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), len) == 0);
    timeval tv{5, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  ~Listener() { ::close(fd_); }

  std::string receive() {
    char buf[128];
    const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
  }

 private:
  int fd_ = -1;
};

std::string uniqueAbstractName() {
  std::random_device rd;
  return "@ddp-sdk-test-" + std::to_string(::getpid()) + "-" + std::to_string(rd());
}

}  // namespace

TEST_CASE("Heartbeat sends RANK STEP to an abstract-namespace socket", "[sdk]") {
  const std::string name = uniqueAbstractName();
  Listener agent(name);
  ddp::Env env;
  env.rank = 3;
  env.heartbeatSocket = name;
  ddp::Heartbeat heartbeat(ddp::HeartbeatOptions{env.heartbeatSocket, env.rank, std::chrono::milliseconds(0)});
  REQUIRE(heartbeat.enabled());
  heartbeat.beat(42);
  CHECK(agent.receive() == "3 42\n");
  heartbeat.beat(43);
  CHECK(agent.receive() == "3 43\n");
}

TEST_CASE("Heartbeat thins beats closer than its interval, and the next carries the mean step time", "[sdk]") {
  const std::string name = uniqueAbstractName();
  Listener agent(name);
  ddp::Heartbeat heartbeat(ddp::HeartbeatOptions{name, 1, std::chrono::milliseconds(200)});
  heartbeat.beat(1);
  CHECK(agent.receive() == "1 1\n");
  heartbeat.beat(2, 0.25);  // too soon: not sent
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  heartbeat.beat(3, 0.75);
  CHECK(agent.receive() == "1 3 time=0.500000\n");
  heartbeat.beat(4, 1e9);  // out of the grammar's bounds: the beat goes, the time does not
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  heartbeat.beat(5);
  CHECK(agent.receive() == "1 5\n");
}

TEST_CASE("Heartbeat sends its last thinned beat when it is destroyed", "[sdk]") {
  const std::string name = uniqueAbstractName();
  Listener agent(name);
  {
    ddp::Heartbeat heartbeat(ddp::HeartbeatOptions{name, 4, std::chrono::milliseconds(10000)});
    heartbeat.beat(1);
    heartbeat.beat(2);
    heartbeat.beat(3);
  }
  CHECK(agent.receive() == "4 1\n");
  CHECK(agent.receive() == "4 3\n");
}

TEST_CASE("Heartbeat sends to a socket path", "[sdk]") {
  ddprun::test::TempDir dir;
  const std::string path = dir.file("hb.sock");
  Listener agent(path);
  ddp::Heartbeat heartbeat(ddp::HeartbeatOptions{path, 0});
  heartbeat.beat(-1);
  CHECK(agent.receive() == "0 -1\n");
}

TEST_CASE("Heartbeat does nothing without a socket and never throws", "[sdk]") {
  ddp::Heartbeat off(ddp::Env{});
  CHECK_FALSE(off.enabled());
  off.beat(1);

  ddp::Heartbeat nobody(ddp::HeartbeatOptions{uniqueAbstractName(), 1});  // no listener
  CHECK(nobody.enabled());
  for (int i = 0; i < 1000; ++i) nobody.beat(i);

  ddp::Heartbeat tooLong(ddp::HeartbeatOptions{"@" + std::string(200, 'x'), 1});
  CHECK_FALSE(tooLong.enabled());
  tooLong.beat(1);
}

TEST_CASE("Heartbeat sections: a change always goes, sections nest, and a beat carries the innermost", "[sdk]") {
  const std::string name = uniqueAbstractName();
  Listener agent(name);
  ddp::Heartbeat heartbeat(ddp::HeartbeatOptions{name, 2, std::chrono::milliseconds(10000)});
  heartbeat.beat(7);
  CHECK(agent.receive() == "2 7\n");
  {
    auto checkpoint = heartbeat.section("checkpoint");  // within the interval, and still sent
    CHECK(agent.receive() == "2 7 section=checkpoint\n");
    {
      auto eval = heartbeat.section("eval at epoch 2/3");
      CHECK(agent.receive() == "2 7 section=eval_at_epoch_2_3\n");
    }
    CHECK(agent.receive() == "2 7 section=checkpoint\n");
    heartbeat.beat(8);  // the same section, within the interval: held back
  }
  CHECK(agent.receive() == "2 8\n");
}

TEST_CASE("Heartbeat prefers the inherited channel and ignores a number that names no channel", "[sdk]") {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
  const std::string name = uniqueAbstractName();
  Listener fallback(name);
  {
    ddp::Heartbeat heartbeat(ddp::HeartbeatOptions{.socket = name, .rank = 1, .fd = sv[1]});
    heartbeat.beat(3);
    char buf[64];
    const ssize_t n = ::recv(sv[0], buf, sizeof(buf), 0);
    CHECK(std::string(buf, n > 0 ? static_cast<std::size_t>(n) : 0) == "1 3\n");
  }
  int pipeFds[2];
  REQUIRE(::pipe(pipeFds) == 0);
  {
    ddp::Heartbeat heartbeat(ddp::HeartbeatOptions{.socket = name, .rank = 1, .fd = pipeFds[1]});
    heartbeat.beat(4);
    CHECK(fallback.receive() == "1 4\n");
  }
  CHECK(::fcntl(sv[1], F_GETFD) != -1);  // the inherited end is the caller's: still open
  for (int fd : {sv[0], sv[1], pipeFds[0], pipeFds[1]}) ::close(fd);
}
