// Who holds the other end of an accepted loopback connection (agent/socket_peer.h), on real
// sockets and processes: this process, a forked child, IPv6, a dual-stack listener, and a peer
// that closed before the question was asked.
#include "agent/socket_peer.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>

#include "common/unique_fd.h"
#include "test_skip.h"

namespace {

using ddprun::UniqueFd;

// An address of `family` from its text form and a port.
sockaddr_storage addressOf(int family, const char* host, uint16_t port, socklen_t* len) {
  sockaddr_storage ss{};
  if (family == AF_INET) {
    auto* sin = reinterpret_cast<sockaddr_in*>(&ss);
    sin->sin_family = AF_INET;
    sin->sin_port = htons(port);
    ::inet_pton(AF_INET, host, &sin->sin_addr);
    *len = sizeof(sockaddr_in);
  } else {
    auto* sin6 = reinterpret_cast<sockaddr_in6*>(&ss);
    sin6->sin6_family = AF_INET6;
    sin6->sin6_port = htons(port);
    ::inet_pton(AF_INET6, host, &sin6->sin6_addr);
    *len = sizeof(sockaddr_in6);
  }
  return ss;
}

// A listener on host:0 (an IPv6 one dual-stack, so that it can take ::ffff:127.0.0.1); an empty fd
// when the machine cannot (no IPv6). Its port goes to *port.
UniqueFd listenOn(int family, const char* host, uint16_t* port) {
  UniqueFd fd(::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return fd;
  if (family == AF_INET6) {
    int off = 0;
    ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off));
  }
  socklen_t len = 0;
  sockaddr_storage ss = addressOf(family, host, 0, &len);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0 || ::listen(fd.get(), 8) != 0) return UniqueFd();
  len = sizeof(ss);
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len);
  *port = ntohs(family == AF_INET ? reinterpret_cast<sockaddr_in*>(&ss)->sin_port
                                  : reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return fd;
}

// A connected client socket; async-signal-safe, so that a forked child may call it.
int connectTo(int family, const char* host, uint16_t port) {
  int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  socklen_t len = 0;
  sockaddr_storage ss = addressOf(family, host, port, &len);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

UniqueFd acceptOne(const UniqueFd& listener) { return UniqueFd(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC)); }

ino_t inodeOf(int fd) {
  struct stat st {};
  ::fstat(fd, &st);
  return st.st_ino;
}

// A forked child that connects to host:port, says so, and waits until the test lets it go; killed
// and reaped when the test ends, on every path.
class ConnectedChild {
 public:
  ConnectedChild(int family, const char* host, uint16_t port) {
    ddprun::Pipe ready = ddprun::makePipe();
    ddprun::Pipe hold = ddprun::makePipe();  // the child runs until its write end closes
    pid_ = ::fork();
    if (pid_ == 0) {
      // The socket is made here, after the fork, so that the test process never holds it.
      int fd = connectTo(family, host, port);
      char ok = fd >= 0 ? 1 : 0;
      (void)!::write(ready.write.get(), &ok, 1);
      ::close(hold.write.get());
      char byte;
      (void)!::read(hold.read.get(), &byte, 1);
      ::_exit(0);
    }
    hold_ = std::move(hold.write);
    ready.write.reset();
    char ok = 0;
    connected_ = pid_ > 0 && ::read(ready.read.get(), &ok, 1) == 1 && ok == 1;
  }
  ~ConnectedChild() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  ConnectedChild(const ConnectedChild&) = delete;
  ConnectedChild& operator=(const ConnectedChild&) = delete;

  pid_t pid() const { return pid_; }
  bool connected() const { return connected_; }

 private:
  pid_t pid_ = -1;
  bool connected_ = false;
  UniqueFd hold_;
};

}  // namespace

TEST_CASE("socket peer: a connection from this process is found here", "[socket_peer]") {
  uint16_t port = 0;
  UniqueFd listener = listenOn(AF_INET, "127.0.0.1", &port);
  REQUIRE(listener);
  UniqueFd client(connectTo(AF_INET, "127.0.0.1", port));
  REQUIRE(client);
  UniqueFd accepted = acceptOne(listener);
  REQUIRE(accepted);

  std::string why;
  auto peer = ddprun::peerSocketOf(accepted.get(), &why);
  INFO(why);
  REQUIRE(peer.has_value());
  // The peer's socket is the client's, not the accepted one that this process also holds.
  CHECK(peer->inode == inodeOf(client.get()));
  CHECK(peer->inode != inodeOf(accepted.get()));
  CHECK(peer->uid == ::getuid());
  CHECK(ddprun::processHoldsSocket(::getpid(), peer->inode));

  ddprun::ProcSocketPeerFinder finder;
  CHECK(finder.ownerAmong(accepted.get(), {::getpid()}, &why) == ::getpid());
}

TEST_CASE("socket peer: a child's connection is the child's, not the accepting process's", "[socket_peer]") {
  uint16_t port = 0;
  UniqueFd listener = listenOn(AF_INET, "127.0.0.1", &port);
  REQUIRE(listener);
  ConnectedChild child(AF_INET, "127.0.0.1", port);
  REQUIRE(child.connected());
  UniqueFd accepted = acceptOne(listener);
  REQUIRE(accepted);

  ddprun::ProcSocketPeerFinder finder;
  std::string why;
  auto owner = finder.ownerAmong(accepted.get(), {child.pid()}, &why);
  INFO(why);
  CHECK(owner == child.pid());
  CHECK(finder.ownerAmong(accepted.get(), {::getpid(), child.pid()}, &why) == child.pid());

  why.clear();
  CHECK_FALSE(finder.ownerAmong(accepted.get(), {::getpid()}, &why).has_value());
  CHECK_FALSE(why.empty());
  why.clear();
  CHECK_FALSE(finder.ownerAmong(accepted.get(), {}, &why).has_value());
  CHECK_FALSE(why.empty());
}

TEST_CASE("socket peer: an IPv6 connection on ::1", "[socket_peer]") {
  uint16_t port = 0;
  UniqueFd listener = listenOn(AF_INET6, "::1", &port);
  if (!listener) DDPRUN_SKIP("no IPv6 loopback here: cannot listen on [::1]");
  ConnectedChild child(AF_INET6, "::1", port);
  REQUIRE(child.connected());
  UniqueFd accepted = acceptOne(listener);
  REQUIRE(accepted);

  ddprun::ProcSocketPeerFinder finder;
  std::string why;
  auto owner = finder.ownerAmong(accepted.get(), {::getpid(), child.pid()}, &why);
  INFO(why);
  CHECK(owner == child.pid());
  CHECK_FALSE(finder.ownerAmong(accepted.get(), {::getpid()}, &why).has_value());
}

TEST_CASE("socket peer: IPv4 through a dual-stack listener is asked as IPv4", "[socket_peer]") {
  uint16_t port = 0;
  UniqueFd listener = listenOn(AF_INET6, "::ffff:127.0.0.1", &port);
  if (!listener) DDPRUN_SKIP("no IPv6 here: cannot listen on [::ffff:127.0.0.1]");
  ddprun::ProcSocketPeerFinder finder;

  SECTION("an IPv4 client") {
    ConnectedChild child(AF_INET, "127.0.0.1", port);
    REQUIRE(child.connected());
    UniqueFd accepted = acceptOne(listener);
    REQUIRE(accepted);
    std::string why;
    auto owner = finder.ownerAmong(accepted.get(), {::getpid(), child.pid()}, &why);
    INFO(why);
    CHECK(owner == child.pid());
  }
  SECTION("a dual-stack IPv6 client on ::ffff:127.0.0.1") {
    ConnectedChild child(AF_INET6, "::ffff:127.0.0.1", port);
    REQUIRE(child.connected());
    UniqueFd accepted = acceptOne(listener);
    REQUIRE(accepted);
    std::string why;
    auto owner = finder.ownerAmong(accepted.get(), {::getpid(), child.pid()}, &why);
    INFO(why);
    CHECK(owner == child.pid());
  }
}

TEST_CASE("socket peer: a peer that already closed is nobody, said at once", "[socket_peer]") {
  uint16_t port = 0;
  UniqueFd listener = listenOn(AF_INET, "127.0.0.1", &port);
  REQUIRE(listener);
  UniqueFd client(connectTo(AF_INET, "127.0.0.1", port));
  REQUIRE(client);
  UniqueFd accepted = acceptOne(listener);
  REQUIRE(accepted);

  SECTION("closed: its socket lingers, owned by no process") { client.reset(); }
  SECTION("reset: its socket is gone") {
    linger hard{.l_onoff = 1, .l_linger = 0};
    REQUIRE(::setsockopt(client.get(), SOL_SOCKET, SO_LINGER, &hard, sizeof(hard)) == 0);
    client.reset();
  }

  ddprun::ProcSocketPeerFinder finder;
  std::string why;
  const auto start = std::chrono::steady_clock::now();
  auto peer = ddprun::peerSocketOf(accepted.get(), &why);
  INFO(why);
  CHECK_FALSE(peer.has_value());
  CHECK_FALSE(why.empty());
  std::string ownerWhy;
  auto owner = finder.ownerAmong(accepted.get(), {::getpid()}, &ownerWhy);
  INFO(ownerWhy);
  CHECK_FALSE(owner.has_value());
  CHECK_FALSE(ownerWhy.empty());
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::milliseconds(500));
}

TEST_CASE("socket peer: a socket that is not TCP is refused with a reason", "[socket_peer]") {
  int pair[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) == 0);
  UniqueFd a(pair[0]), b(pair[1]);
  std::string why;
  CHECK_FALSE(ddprun::peerSocketOf(a.get(), &why).has_value());
  CHECK_FALSE(why.empty());
}

TEST_CASE("socket peer: a process that is gone holds nothing, and says why", "[socket_peer]") {
  pid_t gone = ::fork();
  if (gone == 0) ::_exit(0);
  REQUIRE(gone > 0);
  REQUIRE(::waitpid(gone, nullptr, 0) == gone);
  std::string why;
  CHECK_FALSE(ddprun::processHoldsSocket(gone, 1, &why));
  INFO(why);
  CHECK_FALSE(why.empty());
  // A process that is there but does not hold the socket: no reason, a plain no.
  why.clear();
  CHECK_FALSE(ddprun::processHoldsSocket(::getpid(), 1, &why));
  CHECK(why.empty());
}
