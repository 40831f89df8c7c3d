#include "worker_sdk/tcp_store.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <thread>

#include "common/backoff.h"
#include "common/connect.h"
#include "common/error.h"
#include "store/core/store_limits.h"
#include "store/tcpstore/tcpstore_codec.h"

namespace ddp {

namespace tcp = ddprun::tcpstore;
using namespace std::chrono;
using Clock = steady_clock;

namespace {

// A timeout beyond this (milliseconds::max(), "forever") waits this long: a deadline stays
// representable.
constexpr milliseconds kLongestWait = std::chrono::hours(24 * 365);

Clock::time_point after(milliseconds timeout) {
  return Clock::now() + std::clamp(timeout, milliseconds(0), kLongestWait);
}

// Why a connection the agent's TCPStore closed is closed: the protocol's only refusal.
constexpr const char* kClosedWhy = "a stale round, a refusal, or the agent ended";

// A command's first byte in torch 2.x's dialect (tcpstore_codec.h: the Op's number).
std::string command(tcp::Op op) {
  std::string out;
  tcp::appendU8(out, static_cast<uint8_t>(op));
  return out;
}

std::string keysCommand(tcp::Op op, const std::vector<std::string>& keys) {
  std::string out = command(op);
  std::string count;
  tcp::appendI64(count, static_cast<int64_t>(keys.size()));  // a uint64 on the wire
  out += count;
  for (const auto& k : keys) tcp::appendBytes(out, k);
  return out;
}

void checkKey(const std::string& key) {
  if (key.empty()) throw ddprun::ConfigError("store: an empty key");
  if (key.size() > ddprun::kMaxStoreKeyBytes) {
    throw ddprun::ConfigError("store: a key of " + std::to_string(key.size()) + " bytes, more than " +
                              std::to_string(ddprun::kMaxStoreKeyBytes));
  }
}

std::string joined(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) out += (out.empty() ? "" : ", ") + k;
  return out;
}

}  // namespace

TcpStore::TcpStore(TcpStoreOptions options) : options_(std::move(options)) {
  const auto deadline = after(options_.connectTimeout);
  const std::string where = options_.host + ":" + std::to_string(options_.port);
  ddprun::Backoff backoff(milliseconds(10), milliseconds(250));
  for (;;) {
    ddprun::Connected c = ddprun::connectWithin(options_.host, options_.port, deadline);
    if (c.fd) {
      fd_ = std::move(c.fd);
      break;
    }
    // Refused: the agent's store is up before any worker starts, but retry as torch's client does.
    if (c.failure != ddprun::Connected::Failure::kRefused || Clock::now() + milliseconds(10) >= deadline) {
      throw ddprun::ConnectionError("store: cannot connect to the agent's TCPStore at " + where + ": " + c.why);
    }
    std::this_thread::sleep_for(std::min(backoff.next(), duration_cast<milliseconds>(deadline - Clock::now())));
  }
  const int one = 1;
  ::setsockopt(fd_.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  // VALIDATE and the magic, then a PING: its echo says the agent admitted this process (a refused
  // connection is closed unread).
  std::string open = command(tcp::Op::kValidate);
  tcp::appendU32(open, tcp::kValidationMagic);
  const uint32_t nonce = std::random_device{}();
  open += command(tcp::Op::kPing);
  tcp::appendU32(open, nonce);
  std::lock_guard<std::mutex> lock(mu_);
  send(open);
  uint32_t echo = 0;
  char buf[sizeof echo];
  if (!recvBy(buf, sizeof buf, after(options_.connectTimeout))) {
    fail("the agent's TCPStore at " + where + " did not answer its first ping");
  }
  std::memcpy(&echo, buf, sizeof echo);
  if (echo != nonce) fail("the agent's TCPStore at " + where + " echoed a wrong ping nonce");
}

void TcpStore::fail(const std::string& why) {
  fd_.reset();
  throw ddprun::ConnectionError("store: " + why);
}

void TcpStore::send(const std::string& bytes) {
  if (!fd_) throw ddprun::ConnectionError("store: the connection to the agent's TCPStore is closed");
  std::size_t sent = 0;
  const auto deadline = after(options_.timeout);
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd_.get(), bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const auto left = duration_cast<milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) fail("the agent's TCPStore read nothing for " + std::to_string(options_.timeout.count()) + " ms");
      pollfd p{fd_.get(), POLLOUT, 0};
      ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
      continue;
    }
    fail(std::string("the agent's TCPStore closed the connection (") + std::strerror(errno) + "): " + kClosedWhy);
  }
}

bool TcpStore::recvBy(char* out, std::size_t n, Clock::time_point deadline) {
  if (!fd_) throw ddprun::ConnectionError("store: the connection to the agent's TCPStore is closed");
  std::size_t got = 0;
  while (got < n) {
    const ssize_t r = ::recv(fd_.get(), out + got, n - got, 0);
    if (r > 0) {
      got += static_cast<std::size_t>(r);
      continue;
    }
    if (r == 0) fail(std::string("the agent's TCPStore closed the connection: ") + kClosedWhy);
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      fail(std::string("the connection to the agent's TCPStore failed: ") + std::strerror(errno));
    }
    const auto left = duration_cast<milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      if (got > 0) fail("the agent's TCPStore stopped in the middle of an answer");
      return false;
    }
    pollfd p{fd_.get(), POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
  }
  return true;
}

void TcpStore::recvAnswer(char* out, std::size_t n, const char* what) {
  if (!recvBy(out, n, after(options_.timeout))) {
    fail(std::string("no answer to ") + what + " within " + std::to_string(options_.timeout.count()) + " ms");
  }
}

int64_t TcpStore::recvI64(const char* what) {
  int64_t v = 0;
  char buf[sizeof v];
  recvAnswer(buf, sizeof buf, what);
  std::memcpy(&v, buf, sizeof v);
  return v;
}

std::string TcpStore::recvBytes(const char* what) {
  const int64_t n = recvI64(what);
  if (n < 0 || static_cast<uint64_t>(n) > ddprun::kMaxStoreValueBytes) {
    fail(std::string("the answer to ") + what + " declares " + std::to_string(n) + " bytes, over the store's limit");
  }
  std::string out(static_cast<std::size_t>(n), '\0');
  if (n > 0) recvAnswer(out.data(), out.size(), what);
  return out;
}

void TcpStore::set(const std::string& key, const std::string& value) {
  checkKey(key);
  std::string c = command(tcp::Op::kSet);
  tcp::appendBytes(c, key);
  tcp::appendBytes(c, value);
  std::lock_guard<std::mutex> lock(mu_);
  send(c);  // no answer: torch's client does not wait for one either
}

std::string TcpStore::get(const std::string& key) {
  checkKey(key);
  std::lock_guard<std::mutex> lock(mu_);
  waitLocked({key}, options_.timeout);  // as torch's client: GET answers a missing key with nothing
  std::string c = command(tcp::Op::kGet);
  tcp::appendBytes(c, key);
  send(c);
  return recvBytes("get");
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  checkKey(key);
  std::string c = command(tcp::Op::kAdd);
  tcp::appendBytes(c, key);
  tcp::appendI64(c, delta);
  std::lock_guard<std::mutex> lock(mu_);
  send(c);
  return recvI64("add");
}

std::string TcpStore::compareSet(const std::string& key, const std::string& expected, const std::string& desired) {
  checkKey(key);
  std::string c = command(tcp::Op::kCompareSet);
  tcp::appendBytes(c, key);
  tcp::appendBytes(c, expected);
  tcp::appendBytes(c, desired);
  std::lock_guard<std::mutex> lock(mu_);
  send(c);
  std::string now = recvBytes("compare_set");
  // TCPStore answers a missing key with `expected` when that is not empty (and sets nothing); this
  // interface answers it with "". `expected` back when it was not swapped in means the key is
  // missing (a present key that held `expected` would have become `desired`); when expected ==
  // desired the answer cannot tell, so ask.
  if (!expected.empty() && now == expected && (expected != desired || !checkLocked({key}))) return std::string();
  return now;
}

void TcpStore::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  for (const auto& k : keys) checkKey(k);
  std::lock_guard<std::mutex> lock(mu_);
  waitLocked(keys, timeout);
}

void TcpStore::waitLocked(const std::vector<std::string>& keys, milliseconds timeout) {
  if (keys.empty()) return;
  send(keysCommand(tcp::Op::kWait, keys));
  char b = 0;
  if (recvBy(&b, 1, after(timeout))) {
    if (static_cast<uint8_t>(b) != tcp::kStopWaiting) fail("a wait answered with an unknown byte");
    return;
  }
  // Timed out: cancel as torch's client does. A STOP_WAITING already on its way comes first (the
  // keys came in the meantime); WAIT_CANCELED ends the exchange either way.
  send(command(tcp::Op::kCancelWait));
  bool stopped = false;
  for (;;) {
    recvAnswer(&b, 1, "cancel_wait");
    if (static_cast<uint8_t>(b) == tcp::kWaitCanceled) break;
    if (static_cast<uint8_t>(b) != tcp::kStopWaiting) fail("a cancelled wait answered with an unknown byte");
    stopped = true;
  }
  if (stopped) return;
  throw ddprun::TimeoutError("timed out after " + std::to_string(timeout.count()) + " ms waiting for key(s) " +
                             joined(keys) + " in the agent's TCPStore");
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  for (const auto& k : keys) checkKey(k);
  std::lock_guard<std::mutex> lock(mu_);
  return checkLocked(keys);
}

bool TcpStore::checkLocked(const std::vector<std::string>& keys) {
  send(keysCommand(tcp::Op::kCheck, keys));
  char b = 0;
  recvAnswer(&b, 1, "check");
  return static_cast<uint8_t>(b) == tcp::kCheckReady;
}

bool TcpStore::deleteKey(const std::string& key) {
  checkKey(key);
  std::string c = command(tcp::Op::kDelete);
  tcp::appendBytes(c, key);
  std::lock_guard<std::mutex> lock(mu_);
  send(c);
  return recvI64("delete_key") > 0;
}

int64_t TcpStore::numKeys() {
  std::lock_guard<std::mutex> lock(mu_);
  send(command(tcp::Op::kNumKeys));
  return recvI64("num_keys");
}

}  // namespace ddp
