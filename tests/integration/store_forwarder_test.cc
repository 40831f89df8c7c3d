// StoreForwarder (store/forward/): sinks that send a connection's requests on to the job's store,
// here a real RendezvousServer on loopback with a job token, whose store serves the round of a
// 1-node job that an agent's Session joined. What a sink answers is compared with what a direct
// StoreClient sees; waits are sliced (waitSlice 100 ms here); end(), stop() and a store that goes
// away must leave no wait hanging. Harness: rendezvous_test_harness.h (its watchdog ends the
// executable when a test hangs).
#include <arpa/inet.h>
#include <catch2/catch.hpp>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "common/unique_fd.h"
#include "ddprun/v1/store.pb.h"
#include "rendezvous_test_harness.h"
#include "store/forward/forwarding_sink.h"
#include "store/core/store_status.h"

using Catch::Matchers::Contains;
using namespace ddprun::test;
using ddprun::StoreCode;
using ddprun::v1::StoreRequest;
using ddprun::v1::StoreResponse;

namespace {

constexpr milliseconds kSlice = 100ms;
// How long an answer the store owes may take (two shared cores); a safety bound, not a speed claim.
constexpr milliseconds kAnswer = 10s;
// How long nothing must come to count as "no answer".
constexpr milliseconds kSilence = 500ms;

int32_t code(StoreCode c) { return static_cast<int32_t>(c); }
int32_t codeOf(const StoreResponse& r) { return r.has_status() ? r.status().code() : 0; }

// A RendezvousServer with a job token, and a 1-node job in its first round, whose store scope
// the requests below use.
struct JobStore {
  JobStore() : server(kToken), agent(server.address(), kToken) {
    REQUIRE(agent.send(joinMessage("fwd-job", "node", jobRules(1, 1), 1)));
    runIds.push_back("fwd-job");
    rounds.push_back(expectAssigned(agent).round());
  }
  // Job `job`'s scope: 0 is the one above; a test may join more (each with an agent of its own).
  ddprun::StoreClientOptions clientOptions(int job = 0, const std::string& token = kToken) const {
    ddprun::StoreClientOptions o;
    o.address = server.address();
    o.token = token;
    o.runId = runIds.at(job);
    o.round = rounds.at(job);
    o.timeout = 10s;
    o.connectTimeout = 2s;
    return o;
  }
  ddprun::StoreForwarderOptions forwarderOptions(const std::string& token = kToken) const {
    ddprun::StoreForwarderOptions o;
    o.client = clientOptions(0, token);
    o.client.runId.clear();  // unused: each request carries its scope
    o.waitSlice = kSlice;
    return o;
  }
  template <typename Op>
  void scope(Op* op, int job = 0) const {
    op->mutable_scope()->set_run_id(runIds.at(job));
    op->mutable_scope()->set_round(rounds.at(job));
  }

  TestServer server;
  Session agent;
  std::vector<std::string> runIds;
  std::vector<uint64_t> rounds;
};

// The answers of one sink, as they come, from any thread.
class Answers {
 public:
  ddprun::StoreRequestSink::Respond respond() {
    return [this](StoreResponse&& r) {
      std::lock_guard lock(mu_);
      got_.push_back(std::move(r));
      cv_.notify_all();
    };
  }
  // Whether `n` answers came within `timeout`.
  bool waitFor(std::size_t n, milliseconds timeout = kAnswer) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return got_.size() >= n; });
  }
  std::size_t count() {
    std::lock_guard lock(mu_);
    return got_.size();
  }
  StoreResponse at(std::size_t i) {
    std::lock_guard lock(mu_);
    return got_.at(i);
  }
  std::vector<StoreResponse> all() {
    std::lock_guard lock(mu_);
    return got_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<StoreResponse> got_;
};

StoreRequest getRequest(const JobStore& s, const std::string& key, uint32_t timeoutMs, int job = 0) {
  StoreRequest r;
  auto* op = r.mutable_get();
  s.scope(op, job);
  op->set_key(key);
  op->set_timeout_ms(timeoutMs);
  return r;
}

StoreRequest waitRequest(const JobStore& s, const std::vector<std::string>& keys, uint32_t timeoutMs, int job = 0) {
  StoreRequest r;
  auto* op = r.mutable_wait();
  s.scope(op, job);
  for (const auto& k : keys) op->add_keys(k);
  op->set_timeout_ms(timeoutMs);
  return r;
}

StoreRequest setRequest(const JobStore& s, const std::string& key, const std::string& value, int job = 0) {
  StoreRequest r;
  auto* op = r.mutable_set();
  s.scope(op, job);
  op->set_key(key);
  op->set_value(value);
  return r;
}

// Every operation of the store, in the scope of `job`; some fail (the answers compared include
// the failures' codes).
std::vector<StoreRequest> everyOperation(const JobStore& s, int job) {
  std::vector<StoreRequest> out;
  auto add = [&](auto fill) {
    StoreRequest r;
    fill(r);
    out.push_back(std::move(r));
  };
  const std::string bytes("a\0b\xff", 4);
  out.push_back(setRequest(s, "k", bytes, job));
  out.push_back(getRequest(s, "k", 1000, job));
  out.push_back(getRequest(s, "k", 5000, job));  // longer than a slice, answered by the first
  for (int64_t delta : {3, -1}) {
    add([&](StoreRequest& r) {
      s.scope(r.mutable_add(), job);
      r.mutable_add()->set_key("n");
      r.mutable_add()->set_delta(delta);
    });
  }
  const std::vector<std::pair<std::string, std::string>> compareSets{{"", "first"}, {"wrong", "second"}, {"first", "second"}};
  for (const auto& [expected, desired] : compareSets) {
    add([&](StoreRequest& r) {
      auto* op = r.mutable_compare_set();
      s.scope(op, job);
      op->set_key("c");
      op->set_expected(expected);
      op->set_desired(desired);
    });
  }
  const std::vector<std::vector<std::string>> checks{{"k", "n", "c"}, {"k", "absent"}};
  for (const auto& keys : checks) {
    add([&](StoreRequest& r) {
      s.scope(r.mutable_check(), job);
      for (const auto& k : keys) r.mutable_check()->add_keys(k);
    });
  }
  out.push_back(waitRequest(s, {"k", "n"}, 5000, job));
  add([&](StoreRequest& r) { s.scope(r.mutable_num_keys(), job); });
  for (int i = 0; i < 2; ++i) {
    add([&](StoreRequest& r) {
      s.scope(r.mutable_delete_key(), job);
      r.mutable_delete_key()->set_key("k");
    });
  }
  for (const char* part : {"ab", "cd"}) {
    add([&](StoreRequest& r) {
      s.scope(r.mutable_append(), job);
      r.mutable_append()->set_key("log");
      r.mutable_append()->set_value(part);
    });
  }
  add([&](StoreRequest& r) {
    auto* op = r.mutable_multi_set();
    s.scope(op, job);
    for (const char* k : {"m1", "m2"}) op->add_keys(k);
    for (const char* v : {"v1", "v2"}) op->add_values(v);
  });
  add([&](StoreRequest& r) {
    auto* op = r.mutable_multi_get();
    s.scope(op, job);
    for (const char* k : {"m1", "log", "absent", "m2"}) op->add_keys(k);
  });
  add([&](StoreRequest& r) { s.scope(r.mutable_list_keys(), job); });
  add([&](StoreRequest& r) { s.scope(r.mutable_num_keys(), job); });
  out.push_back(setRequest(s, "text", "not a number", job));
  add([&](StoreRequest& r) {  // fails: not a number
    s.scope(r.mutable_add(), job);
    r.mutable_add()->set_key("text");
    r.mutable_add()->set_delta(1);
  });
  out.push_back(getRequest(s, "", 10, job));  // fails: an empty key
  for (uint64_t i = 0; i < out.size(); ++i) out[i].set_id(100 + i);
  return out;
}

// An answer as compared: no id, no message (it names the run), list_keys sorted.
std::string comparable(StoreResponse r) {
  r.set_id(0);
  r.mutable_status()->clear_message();
  if (r.has_list_keys()) {
    auto* keys = r.mutable_list_keys()->mutable_keys();
    std::sort(keys->begin(), keys->end());
  }
  return r.ShortDebugString();
}

// A TCP proxy on 127.0.0.1 to `targetPort`: cut() drops every connection at once (no answer, no
// goodbye, as a host that vanished) and refuses new ones.
class CuttableProxy {
 public:
  explicit CuttableProxy(int targetPort) : target_(targetPort) {
    listener_ = ddprun::UniqueFd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(listener_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(listener_.get(), 16) == 0);
    socklen_t len = sizeof addr;
    REQUIRE(::getsockname(listener_.get(), reinterpret_cast<sockaddr*>(&addr), &len) == 0);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { loop(); });
  }
  ~CuttableProxy() {
    stop_ = true;
    thread_.join();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  void cut() { cut_ = true; }

 private:
  void loop() {
    std::vector<std::pair<ddprun::UniqueFd, ddprun::UniqueFd>> conns;
    while (!stop_) {
      if (cut_) {
        conns.clear();  // closes both ends of each
        listener_.reset();
      }
      std::vector<pollfd> fds;
      if (listener_.get() >= 0) fds.push_back({listener_.get(), POLLIN, 0});
      for (auto& [a, b] : conns) {
        fds.push_back({a.get(), POLLIN, 0});
        fds.push_back({b.get(), POLLIN, 0});
      }
      if (::poll(fds.data(), fds.size(), 20) <= 0) continue;
      std::vector<int> broken;
      for (const auto& p : fds) {
        if (p.revents == 0) continue;
        if (p.fd == listener_.get()) {
          ddprun::UniqueFd in(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
          ddprun::UniqueFd out(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
          sockaddr_in addr{};
          addr.sin_family = AF_INET;
          addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
          addr.sin_port = htons(static_cast<uint16_t>(target_));
          if (in.get() >= 0 && ::connect(out.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
            conns.emplace_back(std::move(in), std::move(out));
          }
          continue;
        }
        for (auto& [a, b] : conns) {
          if (p.fd != a.get() && p.fd != b.get()) continue;
          const int to = p.fd == a.get() ? b.get() : a.get();
          char buf[65536];
          const ssize_t n = ::recv(p.fd, buf, sizeof buf, 0);
          if (n <= 0 || !writeAll(to, buf, static_cast<std::size_t>(n))) broken.push_back(p.fd);
        }
      }
      std::erase_if(conns, [&](const auto& c) {
        return std::find_if(broken.begin(), broken.end(), [&](int fd) { return fd == c.first.get() || fd == c.second.get(); }) !=
               broken.end();
      });
    }
  }
  static bool writeAll(int fd, const char* data, std::size_t n) {
    while (n > 0) {
      const ssize_t w = ::send(fd, data, n, MSG_NOSIGNAL);
      if (w <= 0) return false;
      data += w;
      n -= static_cast<std::size_t>(w);
    }
    return true;
  }

  const int target_;
  int port_ = 0;
  ddprun::UniqueFd listener_;
  std::atomic<bool> stop_{false}, cut_{false};
  std::thread thread_;
};

}  // namespace

TEST_CASE("store forwarder: every operation answers as a direct client sees it", "[store_forwarder]") {
  Watchdog dog(60s, "store forwarder: every operation");
  JobStore store;
  // A second job on the same server: the direct client runs the same sequence there.
  Session otherAgent(store.server.address(), kToken);
  const std::string otherRun = "fwd-direct";
  REQUIRE(otherAgent.send(joinMessage(otherRun, "node", jobRules(1, 1), 1)));
  store.runIds.push_back(otherRun);
  store.rounds.push_back(expectAssigned(otherAgent).round());

  ddprun::StoreForwarder forwarder(store.forwarderOptions());
  Answers answers;
  auto sink = forwarder.makeSink(answers.respond());
  auto forwarded = everyOperation(store, 0);
  for (auto request : forwarded) sink->handle(request);
  REQUIRE(answers.waitFor(forwarded.size()));

  ddprun::StoreClient direct(store.clientOptions(1));
  auto requests = everyOperation(store, 1);
  for (std::size_t i = 0; i < requests.size(); ++i) {
    StoreRequest request = requests[i];
    const uint32_t wait = request.has_get() ? request.get().timeout_ms() : request.has_wait() ? request.wait().timeout_ms() : 1000;
    const StoreResponse expected = direct.call(request, milliseconds(wait));
    const StoreResponse got = answers.at(i);
    INFO("request " << requests[i].ShortDebugString() << "\nforwarded: " << got.ShortDebugString()
                    << "\ndirect: " << expected.ShortDebugString());
    CHECK(got.id() == forwarded[i].id());  // the adapter's id comes back, in order
    CHECK(comparable(got) == comparable(expected));
  }
  // A few by value, lest both sides be wrong the same way.
  CHECK(answers.at(1).get().value() == std::string("a\0b\xff", 4));
  CHECK(answers.at(4).add().value() == 2);
  CHECK(answers.at(17).multi_get().values(1) == "abcd");
  CHECK(codeOf(answers.at(forwarded.size() - 2)) == code(StoreCode::kFailedPrecondition));
  CHECK(codeOf(answers.at(forwarded.size() - 1)) == code(StoreCode::kInvalidArgument));
  CHECK(answers.count() == forwarded.size());  // exactly one answer each
}

TEST_CASE("store forwarder: a wait blocks across slices until another client sets its keys", "[store_forwarder]") {
  Watchdog dog(60s, "store forwarder: a wait blocks across slices");
  JobStore store;
  ddprun::StoreForwarder forwarder(store.forwarderOptions());
  ddprun::StoreClient setter(store.clientOptions());
  Answers answers;
  auto sink = forwarder.makeSink(answers.respond());
  auto get = getRequest(store, "late", 20000);
  get.set_id(1);
  auto wait = waitRequest(store, {"late", "later"}, 20000);
  wait.set_id(2);
  sink->handle(get);
  sink->handle(wait);
  // Several slices pass with no answer.
  CHECK_FALSE(answers.waitFor(1, kSlice * 5));
  setter.set("late", "value");
  REQUIRE(answers.waitFor(1));
  CHECK(answers.at(0).id() == 1);
  CHECK(codeOf(answers.at(0)) == 0);
  CHECK(answers.at(0).get().value() == "value");
  CHECK_FALSE(answers.waitFor(2, kSlice * 4));  // the wait still needs "later"
  setter.add("later", 1);
  REQUIRE(answers.waitFor(2));
  CHECK(answers.at(1).id() == 2);
  CHECK(codeOf(answers.at(1)) == 0);
  CHECK(answers.at(1).has_wait());
}

TEST_CASE("store forwarder: a wait that times out is answered as the store would, at its timeout", "[store_forwarder]") {
  Watchdog dog(60s, "store forwarder: a wait that times out");
  JobStore store;
  ddprun::StoreForwarder forwarder(store.forwarderOptions());
  ddprun::StoreClient direct(store.clientOptions());
  Answers answers;
  auto sink = forwarder.makeSink(answers.respond());
  constexpr uint32_t kTimeoutMs = 450;  // four and a half slices
  auto wait = waitRequest(store, {"never"}, kTimeoutMs);
  wait.set_id(7);
  auto get = getRequest(store, "never", kTimeoutMs);
  get.set_id(8);
  auto shortGet = getRequest(store, "never", 50);  // within one slice
  shortGet.set_id(9);
  const auto start = Clock::now();
  sink->handle(wait);
  REQUIRE(answers.waitFor(1));
  CHECK(Clock::now() - start >= milliseconds(kTimeoutMs));
  sink->handle(get);
  sink->handle(shortGet);
  REQUIRE(answers.waitFor(3));

  auto directWait = waitRequest(store, {"never"}, kTimeoutMs);
  const StoreResponse expected = direct.call(directWait, milliseconds(kTimeoutMs));
  INFO("direct: " << expected.ShortDebugString());
  REQUIRE(codeOf(expected) == code(StoreCode::kDeadlineExceeded));
  for (std::size_t i = 0; i < 3; ++i) {
    const StoreResponse got = answers.at(i);
    INFO("forwarded: " << got.ShortDebugString());
    CHECK(got.id() == 7 + i);
    CHECK(codeOf(got) == code(StoreCode::kDeadlineExceeded));
    CHECK_THAT(got.status().message(), Contains("'never'"));
  }
  // The same words as the store's own, naming the whole timeout, not the last slice.
  CHECK(answers.at(0).status().message() == expected.status().message());
  CHECK_THAT(answers.at(1).status().message(), Contains("timed out after 450 ms"));
  CHECK_THAT(answers.at(2).status().message(), Contains("timed out after 50 ms"));
}

TEST_CASE("store forwarder: end() during a wait answers nothing more, and stop() returns promptly", "[store_forwarder]") {
  Watchdog dog(60s, "store forwarder: end() during a wait");
  JobStore store;
  ddprun::StoreClient setter(store.clientOptions());
  ddprun::StoreForwarder forwarder(store.forwarderOptions());
  Answers answers, other;
  auto sink = forwarder.makeSink(answers.respond());
  auto otherSink = forwarder.makeSink(other.respond());
  auto wait = waitRequest(store, {"gate"}, 60000);
  sink->handle(wait);
  auto queued = setRequest(store, "after", "x");
  sink->handle(queued);  // behind the wait: forgotten by end()
  auto otherWait = waitRequest(store, {"other-gate"}, 60000);
  otherSink->handle(otherWait);
  std::this_thread::sleep_for(kSlice * 3);
  sink->end();
  sink->end();  // idempotent
  setter.set("gate", "open");  // would satisfy the wait: its answer must not come
  auto late = setRequest(store, "late", "x");
  sink->handle(late);  // after end(): ignored
  CHECK_FALSE(answers.waitFor(1, kSilence));
  CHECK_FALSE(setter.check({"after"}));
  CHECK_FALSE(setter.check({"late"}));

  const auto start = Clock::now();
  forwarder.stop();  // ends the other sink, mid-wait, too
  const auto took = Clock::now() - start;
  CHECK(took < 5s);
  forwarder.stop();  // idempotent
  setter.set("other-gate", "open");
  CHECK_FALSE(other.waitFor(1, kSilence));
  CHECK(answers.count() == 0);

  // A sink made after stop() answers at once that there is no store to send to.
  Answers afterStop;
  auto lateSink = forwarder.makeSink(afterStop.respond());
  auto request = setRequest(store, "x", "y");
  request.set_id(5);
  lateSink->handle(request);
  REQUIRE(afterStop.count() == 1);
  CHECK(afterStop.at(0).id() == 5);
  CHECK(codeOf(afterStop.at(0)) == code(StoreCode::kUnavailable));
}

TEST_CASE("store forwarder: one sink answers in request order, and does not hold up another", "[store_forwarder]") {
  Watchdog dog(60s, "store forwarder: answer order");
  JobStore store;
  ddprun::StoreClient setter(store.clientOptions());
  ddprun::StoreForwarder forwarder(store.forwarderOptions());
  Answers answers, other;
  auto sink = forwarder.makeSink(answers.respond());
  auto otherSink = forwarder.makeSink(other.respond());
  constexpr int kRequests = 50;
  auto gate = waitRequest(store, {"gate"}, 20000);
  gate.set_id(1);
  sink->handle(gate);
  for (int i = 0; i < kRequests; ++i) {
    StoreRequest r;
    if (i % 2 == 0) {
      r = setRequest(store, "k" + std::to_string(i), std::to_string(i));
    } else {
      r = getRequest(store, "k" + std::to_string(i - 1), 5000);
    }
    r.set_id(2 + i);
    sink->handle(r);
  }
  // The first sink waits for "gate" (several slices); the other is not held up meanwhile.
  auto quick = setRequest(store, "quick", "1");
  quick.set_id(99);
  otherSink->handle(quick);
  REQUIRE(other.waitFor(1));
  CHECK(codeOf(other.at(0)) == 0);
  CHECK(answers.count() == 0);  // FIFO: nothing passes the wait
  CHECK_FALSE(setter.check({"k0"}));

  setter.set("gate", "open");
  REQUIRE(answers.waitFor(kRequests + 1));
  const auto got = answers.all();
  REQUIRE(got.size() == kRequests + 1);
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("answer " << i << ": " << got[i].ShortDebugString());
    CHECK(got[i].id() == i + 1);
    CHECK(codeOf(got[i]) == 0);
    if (i >= 2 && i % 2 == 0) CHECK(got[i].get().value() == std::to_string(i - 2));
  }
}

TEST_CASE("store forwarder: requests beyond the queue's bound are refused", "[store_forwarder]") {
  Watchdog dog(60s, "store forwarder: the queue's bound");
  JobStore store;
  auto options = store.forwarderOptions();
  options.maxQueuedPerSink = 2;
  ddprun::StoreClient setter(store.clientOptions());
  ddprun::StoreForwarder forwarder(options);
  Answers answers;
  auto sink = forwarder.makeSink(answers.respond());
  auto gate = waitRequest(store, {"gate"}, 20000);
  gate.set_id(1);
  sink->handle(gate);
  // Its thread takes the wait off the queue; then two fit in the queue and the third does not.
  std::this_thread::sleep_for(kSlice * 2);
  for (uint64_t id = 2; id <= 4; ++id) {
    auto r = setRequest(store, "k" + std::to_string(id), "v");
    r.set_id(id);
    sink->handle(r);
  }
  REQUIRE(answers.waitFor(1));
  CHECK(answers.at(0).id() == 4);
  CHECK(codeOf(answers.at(0)) == code(StoreCode::kResourceExhausted));
  setter.set("gate", "open");
  REQUIRE(answers.waitFor(4));
  CHECK(answers.at(1).id() == 1);
  CHECK(answers.at(2).id() == 2);
  CHECK(answers.at(3).id() == 3);
}

TEST_CASE("store forwarder: a wrong token constructs, and its first call is refused as unauthenticated", "[store_forwarder]") {
  Watchdog dog(60s, "store forwarder: a wrong token");
  JobStore store;
  // The constructor connects and does not throw: the token is refused at the first call.
  ddprun::StoreForwarder forwarder(store.forwarderOptions("not-the-token"));
  Answers answers;
  auto sink = forwarder.makeSink(answers.respond());
  auto request = setRequest(store, "k", "v");
  request.set_id(3);
  sink->handle(request);
  auto wait = waitRequest(store, {"k"}, 5000);
  wait.set_id(4);
  sink->handle(wait);
  REQUIRE(answers.waitFor(2));
  for (std::size_t i = 0; i < 2; ++i) {
    INFO(answers.at(i).ShortDebugString());
    CHECK(answers.at(i).id() == 3 + i);
    CHECK(codeOf(answers.at(i)) == code(StoreCode::kUnauthenticated));
  }
  CHECK_FALSE(ddprun::StoreClient(store.clientOptions()).check({"k"}));
}

TEST_CASE("store forwarder: the store stopping under a wait answers an error, not a hang", "[store_forwarder]") {
  Watchdog dog(60s, "store forwarder: the store stops");
  JobStore store;
  ddprun::StoreForwarder forwarder(store.forwarderOptions());
  Answers answers;
  auto sink = forwarder.makeSink(answers.respond());
  auto wait = waitRequest(store, {"never"}, 60000);
  sink->handle(wait);
  std::this_thread::sleep_for(kSlice * 3);
  const auto start = Clock::now();
  store.server.stop();
  REQUIRE(answers.waitFor(1, kSafetyBound));
  INFO(answers.at(0).ShortDebugString() << " after "
       << std::chrono::duration_cast<milliseconds>(Clock::now() - start).count() << " ms");
  CHECK(codeOf(answers.at(0)) != 0);
  CHECK(codeOf(answers.at(0)) != code(StoreCode::kDeadlineExceeded));  // not its 60 s timeout
  // Later requests fail too, within the client's connect timeout.
  auto set = setRequest(store, "k", "v");
  sink->handle(set);
  REQUIRE(answers.waitFor(2, kSafetyBound));
  CHECK(codeOf(answers.at(1)) == code(StoreCode::kUnavailable));
  const auto stopStart = Clock::now();
  forwarder.stop();
  CHECK(Clock::now() - stopStart < 5s);
}

TEST_CASE("store forwarder: the connection to the store dropping under a wait answers unavailable", "[store_forwarder]") {
  Watchdog dog(60s, "store forwarder: the connection drops");
  JobStore store;
  CuttableProxy proxy(store.server.port());
  auto options = store.forwarderOptions();
  options.client.address = proxy.address();
  ddprun::StoreForwarder forwarder(options);
  Answers answers;
  auto sink = forwarder.makeSink(answers.respond());
  auto wait = waitRequest(store, {"never"}, 60000);
  sink->handle(wait);
  std::this_thread::sleep_for(kSlice * 3);
  proxy.cut();  // the store says nothing: only the broken connection tells
  REQUIRE(answers.waitFor(1, kSafetyBound));
  INFO(answers.at(0).ShortDebugString());
  CHECK(codeOf(answers.at(0)) == code(StoreCode::kUnavailable));
  const auto stopStart = Clock::now();
  forwarder.stop();
  CHECK(Clock::now() - stopStart < 5s);
}

namespace {

int threadCount() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

}  // namespace

TEST_CASE("store forwarder: the threads of ended sinks are joined, not kept", "[store_forwarder]") {
  Watchdog dog(60s, "store forwarder: threads are reaped");
  JobStore store;
  ddprun::StoreForwarder forwarder(store.forwarderOptions());
  auto oneConnection = [&](int i) {
    Answers answers;
    auto sink = forwarder.makeSink(answers.respond());
    auto r = setRequest(store, "k" + std::to_string(i), "v");
    sink->handle(r);
    REQUIRE(answers.waitFor(1));
    sink->end();
  };
  oneConnection(0);
  // A sink that never sends anything costs no thread.
  std::vector<std::shared_ptr<ddprun::StoreRequestSink>> idle;
  const int before = threadCount();
  REQUIRE(before > 0);
  for (int i = 0; i < 20; ++i) idle.push_back(forwarder.makeSink([](StoreResponse&&) {}));
  CHECK(threadCount() <= before);  // not 20 more
  // Each new connection's thread joins the ones that finished: the count stays about level
  // (the last one's thread may still be on its way out).
  for (int i = 1; i <= 40; ++i) oneConnection(i);
  INFO("threads before " << before << ", after " << threadCount());
  CHECK(threadCount() <= before + 3);
  for (auto& sink : idle) sink->end();
  forwarder.stop();
  CHECK(threadCount() <= before);
}
