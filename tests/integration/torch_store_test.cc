// The agent's TCPStore (agent/torch_store.h) on real loopback sockets with the real peer finder:
// a process of the job is admitted, any other is closed unread; a worker that connects before the
// agent has its pid waits for it; a connection of an old round fails at its next request and
// never sees the new round's keys. torch's own clients through a real ddprun: test_torch_store.py.
#include "agent/torch_store.h"

#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <thread>

#include "common/unique_fd.h"
#include "store/tcpstore/tcpstore_codec.h"

namespace ddprun {
namespace {

using namespace std::chrono_literals;

enum : uint8_t { kValidate = 0, kSet = 1, kGet = 3, kPing = 13 };

std::string u64(uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }
std::string str(const std::string& s) { return u64(s.size()) + s; }
std::string op(uint8_t b) { return std::string(1, static_cast<char>(b)); }

UniqueFd connectTo(int port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return UniqueFd();
  return fd;
}

bool sendAll(int fd, const std::string& bytes) {
  return ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
}

// Exactly n bytes, or nullopt when closed or `timeout` passed.
std::optional<std::string> recvN(int fd, std::size_t n, std::chrono::milliseconds timeout = 5s) {
  std::string out;
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (out.size() < n) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) return std::nullopt;
    char buf[4096];
    const ssize_t r = ::recv(fd, buf, std::min(sizeof buf, n - out.size()), 0);
    if (r <= 0) return std::nullopt;
    out.append(buf, static_cast<std::size_t>(r));
  }
  return out;
}

// A torch 2.x client's opening (VALIDATE, PING) and a SET and GET of `key`; true when every
// answer came as torch's server gives it.
bool setAndGet(int fd, const std::string& key, const std::string& value) {
  std::string open = op(kValidate);
  tcpstore::appendU32(open, tcpstore::kValidationMagic);
  open += op(kPing);
  tcpstore::appendU32(open, 0x1234abcd);
  if (!sendAll(fd, open)) return false;
  auto nonce = recvN(fd, 4);
  if (!nonce) return false;
  if (!sendAll(fd, op(kSet) + str(key) + str(value) + op(kGet) + str(key))) return false;
  auto length = recvN(fd, 8);
  if (!length) return false;
  uint64_t n;
  std::memcpy(&n, length->data(), 8);
  auto got = recvN(fd, n);
  return got && *got == value;
}

// Whether the server closed `fd` within `timeout`.
bool closedWithin(int fd, std::chrono::milliseconds timeout = 5s) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char buf[256];
    if (::recv(fd, buf, sizeof buf, 0) <= 0) return true;
  }
  return false;
}

RoundInfo roundOf(uint64_t n) {
  RoundInfo r;
  r.round = n;
  return r;
}

TEST_CASE("torch store: a worker of the job is admitted, a process that is not one is closed unread", "[torch_store]") {
  TorchStore store(TorchStoreOptions{});
  REQUIRE(store.port() > 0);
  store.beginRound("job", roundOf(1));
  // The worker connects before the agent knows its pid, as a fast one can: it waits for admit().
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    UniqueFd fd = connectTo(store.port());
    const bool ok = fd && setAndGet(fd.get(), "/from-worker", "hello");
    ::_exit(ok ? 0 : 1);
  }
  std::this_thread::sleep_for(100ms);
  store.admit({child});
  int status = 0;
  const auto until = std::chrono::steady_clock::now() + 20s;
  pid_t done = 0;
  while ((done = ::waitpid(child, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(10ms);
  }
  if (done == 0) {
    ::kill(child, SIGKILL);
    ::waitpid(child, &status, 0);
  }
  REQUIRE(done == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);

  // This process is not a worker of the job.
  UniqueFd stranger = connectTo(store.port());
  REQUIRE(stranger);
  sendAll(stranger.get(), op(kGet) + str("/from-worker"));
  CHECK(closedWithin(stranger.get()));
  CHECK(store.refusedStrangers() == 1);
  CHECK(store.stats().accepted == 1);

  // The group stopped: no one is admitted.
  store.admit({});
  UniqueFd late = connectTo(store.port());
  REQUIRE(late);
  CHECK(closedWithin(late.get()));
}

TEST_CASE("torch store: a connection of an old round fails at its next request, the new round starts empty", "[torch_store]") {
  TorchStore store(TorchStoreOptions{});
  store.beginRound("job", roundOf(1));
  store.admit({::getpid()});  // this process plays the worker
  UniqueFd old = connectTo(store.port());
  REQUIRE(old);
  REQUIRE(setAndGet(old.get(), "/k", "round1"));

  store.beginRound("job", roundOf(2));
  store.admit({::getpid()});
  UniqueFd fresh = connectTo(store.port());
  REQUIRE(fresh);
  // GET of a key the new round lacks answers empty (torch's client waits first).
  std::string open = op(kValidate);
  tcpstore::appendU32(open, tcpstore::kValidationMagic);
  REQUIRE(sendAll(fresh.get(), open + op(kGet) + str("/k")));
  auto empty = recvN(fresh.get(), 8);
  REQUIRE(empty);
  CHECK(*empty == u64(0));

  REQUIRE(sendAll(old.get(), op(kGet) + str("/k")));
  CHECK(closedWithin(old.get()));
}

TEST_CASE("torch store: a port in use is a clear configuration error", "[torch_store]") {
  TorchStore first(TorchStoreOptions{});
  TorchStoreOptions same;
  same.port = first.port();
  CHECK_THROWS_WITH(TorchStore(same), Catch::Contains("--master_port"));
}

}  // namespace
}  // namespace ddprun
