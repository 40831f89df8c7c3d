// The harness of the rendezvous security tests: a real RendezvousServer on loopback, raw
// Session streams, a running 2-node job to check for disturbance, raw TCP connections, a log
// capture and a watchdog that ends the executable when a test hangs.
#pragma once

#include <catch2/catch.hpp>
#include <grpcpp/grpcpp.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "ddprun/v1/rendezvous.grpc.pb.h"
#include "ddprun/v1/store.grpc.pb.h"
#include "rpc/grpc_util.h"
#include "rendezvous/server/rendezvous_server.h"
#include "store/client/store_client.h"
#include "safety_bound.h"

using namespace std::chrono_literals;
using std::chrono::milliseconds;

namespace ddprun::test {

namespace pb = ddprun::v1;
using Clock = std::chrono::steady_clock;

// How long a reply the server owes may take (two shared cores, other builds running).
constexpr milliseconds kReply = 3s;
// What must not wait for a long timer (a stream's 40 s deadline, a 60 s heartbeat timeout, gRPC's
// 120 s handshake timeout) must happen within this safety bound; it is not a speed claim.
using ddprun::test::kSafetyBound;
// How long a running job must stay quiet to count as undisturbed.
constexpr milliseconds kQuiet = 300ms;
// A distinctive job token: a match anywhere in output is a leak, never a coincidence.
const std::string kToken = "tok-7f3a9c1e5b2d4086-secret";

// Ends the test executable when a test outlives `limit`: a hung server must fail loudly.
class Watchdog {
 public:
  Watchdog(std::chrono::seconds limit, std::string what)
      : what_(std::move(what)), thread_([this, limit] {
          std::unique_lock<std::mutex> lock(mu_);
          if (!cv_.wait_for(lock, limit, [this] { return done_; })) {
            std::fprintf(stderr, "integration test: '%s' still runs after %lld s: the server hangs\n",
                         what_.c_str(), static_cast<long long>(limit.count()));
            std::fflush(stderr);
            std::_Exit(3);
          }
        }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::string what_;
  std::thread thread_;
};

// Options of a server on 127.0.0.1, any port, with every other setting at its default.
inline ddprun::RendezvousServerOptions loopbackServer(std::string token = "") {
  ddprun::RendezvousServerOptions options;
  options.bindAddress = "127.0.0.1";
  options.port = 0;
  options.token = std::move(token);
  return options;
}

// A real RendezvousServer on 127.0.0.1, any port; shut down when the test ends.
struct TestServer {
  explicit TestServer(std::string token = "") : TestServer(loopbackServer(std::move(token))) {}
  explicit TestServer(ddprun::RendezvousServerOptions options) : server(std::move(options)) { REQUIRE(server.port() > 0); }
  ~TestServer() { stop(); }
  // Shuts down (bounded: the watchdog catches a hang) and returns how long it took.
  milliseconds stop() {
    if (stopped) return 0ms;
    stopped = true;
    auto start = Clock::now();
    server.shutdown(0ms);
    return std::chrono::duration_cast<milliseconds>(Clock::now() - start);
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(server.port()); }
  int port() const { return server.port(); }

  ddprun::RendezvousServer server;
  bool stopped = false;
};

inline std::string statusText(const grpc::Status& status) {
  return std::to_string(static_cast<int>(status.error_code())) + " '" + status.error_message() + "'";
}

// One agent's Session stream over its own connection, with a reader thread so that every wait
// for a server message has a timeout. `token`: nullopt sends no token metadata at all.
class Session {
 public:
  explicit Session(const std::string& address, std::optional<std::string> token = std::nullopt,
                   milliseconds life = 40s) {
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(-1);  // the client must be able to send what the server refuses
    args.SetMaxReceiveMessageSize(-1);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own, as an agent has
    channel_ = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
    stub_ = pb::Rendezvous::NewStub(channel_);
    if (token) context_.AddMetadata(ddprun::kTokenMetadataKey, *token);
    context_.set_deadline(std::chrono::system_clock::now() + life);
    stream_ = stub_->Session(&context_);
    reader_ = std::thread([this] { readLoop(); });
  }
  ~Session() { finish(0ms); }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  bool send(const pb::AgentMessage& msg) { return stream_->Write(msg); }
  bool halfClose() { return stream_->WritesDone(); }

  // The next server message, or nullopt when none came within `timeout` or the stream ended.
  std::optional<pb::ServerMessage> next(milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, timeout, [this] { return !queue_.empty() || readDone_; });
    if (queue_.empty()) return std::nullopt;
    pb::ServerMessage msg = std::move(queue_.front());
    queue_.pop_front();
    return msg;
  }

  // Whether the server ended the stream within `timeout` (unread messages may remain).
  bool waitClosed(milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [this] { return readDone_; });
  }
  bool isOpen() {
    std::lock_guard<std::mutex> lock(mu_);
    return !readDone_;
  }

  // The agent vanishes: its call is cancelled, as when the process dies.
  void cancel() { context_.TryCancel(); }

  // Waits up to `timeout` for the server to end the stream, cancels it otherwise, and returns the
  // call's status. Idempotent.
  grpc::Status finish(milliseconds timeout = kReply) {
    if (finished_) return status_;
    if (!waitClosed(timeout)) context_.TryCancel();
    if (reader_.joinable()) reader_.join();
    status_ = stream_->Finish();
    finished_ = true;
    return status_;
  }

  // Waits until at least `count` HeartbeatAcks have arrived.
  bool waitAcks(uint64_t count, milliseconds timeout = kReply) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return acks_ >= count; });
  }
  uint64_t acks() {
    std::lock_guard<std::mutex> lock(mu_);
    return acks_;
  }

  // Every message received, as text, for leak checks.
  std::string transcript() {
    std::lock_guard<std::mutex> lock(mu_);
    return transcript_;
  }

 private:
  void readLoop() {
    pb::ServerMessage msg;
    while (stream_->Read(&msg)) {
      std::lock_guard<std::mutex> lock(mu_);
      transcript_ += msg.ShortDebugString() + "\n";
      // Answers to heartbeats are counted, not queued: tests read the messages that change things.
      if (msg.has_heartbeat_ack()) {
        ++acks_;
      } else {
        queue_.push_back(msg);
      }
      cv_.notify_all();
    }
    std::lock_guard<std::mutex> lock(mu_);
    readDone_ = true;
    cv_.notify_all();
  }

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::Rendezvous::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<pb::AgentMessage, pb::ServerMessage>> stream_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<pb::ServerMessage> queue_;
  std::string transcript_;
  uint64_t acks_ = 0;
  bool readDone_ = false;
  bool finished_ = false;
  grpc::Status status_;
  std::thread reader_;
};

inline pb::JobRules jobRules(int minNodes, int maxNodes, int maxRestarts = 1, uint32_t lastCallMs = 10000) {
  pb::JobRules r;
  r.set_min_nodes(minNodes);
  r.set_max_nodes(maxNodes);
  r.set_max_restarts(maxRestarts);
  r.set_join_timeout_ms(60000);
  r.set_last_call_timeout_ms(lastCallMs);
  r.set_heartbeat_timeout_ms(60000);
  return r;
}

inline pb::AgentMessage joinMessage(const std::string& runId, const std::string& nodeId, const pb::JobRules& rules,
                             int localWorldSize = 1, int masterPort = 29500) {
  pb::AgentMessage msg;
  auto* join = msg.mutable_join();
  join->set_run_id(runId);
  join->set_node_id(nodeId);
  join->set_local_world_size(localWorldSize);
  *join->mutable_rules() = rules;
  join->set_host("127.0.0.1");
  join->set_master_port(masterPort);
  join->set_node_rank(-1);
  return msg;
}

inline pb::AgentMessage heartbeat(uint64_t round) {
  pb::AgentMessage msg;
  msg.mutable_heartbeat()->set_round(round);
  return msg;
}

inline pb::AgentMessage workerFailed(uint64_t round) {
  pb::AgentMessage msg;
  msg.mutable_worker_failed()->set_round(round);
  msg.mutable_worker_failed()->set_rank(0);
  msg.mutable_worker_failed()->set_exit_code(1);
  return msg;
}

inline pb::AgentMessage succeeded(uint64_t round) {
  pb::AgentMessage msg;
  msg.mutable_succeeded()->set_round(round);
  return msg;
}

// The next message, which must come within `timeout`; fails with the stream's status otherwise.
inline pb::ServerMessage expectMessage(Session& s, milliseconds timeout = kReply) {
  auto msg = s.next(timeout);
  if (!msg) {
    if (!s.isOpen()) FAIL("the stream ended without the expected message, status " << statusText(s.finish()));
    FAIL("no message within " << timeout.count() << " ms");
  }
  return *msg;
}

inline pb::RoundAssigned expectAssigned(Session& s, milliseconds timeout = kReply) {
  pb::ServerMessage msg = expectMessage(s, timeout);
  INFO("got " << msg.ShortDebugString());
  REQUIRE(msg.has_round_assigned());
  return msg.round_assigned();
}

inline pb::RoundInterrupted expectInterrupted(Session& s, milliseconds timeout = kReply) {
  pb::ServerMessage msg = expectMessage(s, timeout);
  INFO("got " << msg.ShortDebugString());
  REQUIRE(msg.has_round_interrupted());
  return msg.round_interrupted();
}

// A Rejected with this code and fatality; a fatal one must also end the stream.
inline pb::Rejected expectRejected(Session& s, pb::Rejected::Code code, bool fatal) {
  pb::ServerMessage msg = expectMessage(s);
  INFO("got " << msg.ShortDebugString());
  REQUIRE(msg.has_rejected());
  CHECK(pb::Rejected::Code_Name(msg.rejected().code()) == pb::Rejected::Code_Name(code));
  CHECK(msg.rejected().fatal() == fatal);
  CHECK_FALSE(msg.rejected().message().empty());
  if (fatal) {
    CHECK(s.waitClosed(kReply));
  } else {
    CHECK(s.isOpen());
  }
  return msg.rejected();
}

// A raw Store call that tells whether (runId, round) is the running round of a job.
inline grpc::Status storeCheck(const std::string& address, const std::optional<std::string>& token, const std::string& runId,
                        uint64_t round) {
  auto stub = pb::Store::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kReply);
  if (token) context.AddMetadata(ddprun::kTokenMetadataKey, *token);
  pb::CheckRequest request;
  request.mutable_scope()->set_run_id(runId);
  request.mutable_scope()->set_round(round);
  request.add_keys("probe");
  pb::CheckResponse response;
  return stub->Check(&context, request, &response);
}

// The baseline: a well-formed 2-node job (min = max = 2) in its first round.
struct RunningJob {
  std::string address;
  std::optional<std::string> token;
  std::string runId = "job";
  pb::JobRules rules = jobRules(2, 2, /*maxRestarts=*/1);
  std::unique_ptr<Session> a, b;  // node-a: 2 workers, master port 29501; node-b: 3, 29502
  pb::RoundAssigned assignedA, assignedB;
  uint64_t round = 0;
};

inline std::unique_ptr<RunningJob> startRunningJob(const TestServer& server, std::optional<std::string> token = std::nullopt) {
  auto job = std::make_unique<RunningJob>();
  job->address = server.address();
  job->token = token;
  job->a = std::make_unique<Session>(job->address, token);
  job->b = std::make_unique<Session>(job->address, token);
  REQUIRE(job->a->send(joinMessage(job->runId, "node-a", job->rules, 2, 29501)));
  REQUIRE(job->b->send(joinMessage(job->runId, "node-b", job->rules, 3, 29502)));
  job->assignedA = expectAssigned(*job->a);
  job->assignedB = expectAssigned(*job->b);
  job->round = job->assignedA.round();
  return job;
}

// The running job noticed nothing: both streams open, heartbeats answered (a node the server
// forgot would be told NOT_JOINED), no interruption within kQuiet, and the store still serves
// its round.
inline void requireUndisturbed(RunningJob& job) {
  REQUIRE(job.a->isOpen());
  REQUIRE(job.b->isOpen());
  const uint64_t acksA = job.a->acks(), acksB = job.b->acks();
  REQUIRE(job.a->send(heartbeat(job.round)));
  REQUIRE(job.b->send(heartbeat(job.round)));
  CHECK(job.a->waitAcks(acksA + 1));
  CHECK(job.b->waitAcks(acksB + 1));
  auto fromA = job.a->next(kQuiet);
  auto fromB = job.b->next(0ms);
  if (fromA) FAIL_CHECK("node-a of the running job was disturbed: " << fromA->ShortDebugString());
  if (fromB) FAIL_CHECK("node-b of the running job was disturbed: " << fromB->ShortDebugString());
  REQUIRE(job.a->isOpen());
  REQUIRE(job.b->isOpen());
  grpc::Status store = storeCheck(job.address, job.token, job.runId, job.round);
  INFO("store check of the running round: " << statusText(store));
  REQUIRE(store.ok());
}

// The server still serves: a fresh client starts a 1-node job of its own and is assigned a round.
inline void requireServesNewJob(const TestServer& server, const std::optional<std::string>& token = std::nullopt) {
  static std::atomic<int> counter{0};
  const std::string runId = "fresh-" + std::to_string(counter++);
  Session s(server.address(), token);
  REQUIRE(s.send(joinMessage(runId, "fresh-node", jobRules(1, 1), 1)));
  auto assigned = expectAssigned(s);
  CHECK(assigned.round() == 1);
  CHECK(assigned.group_rank() == 0);
  CHECK(assigned.group_world_size() == 1);
  pb::AgentMessage leave;
  leave.mutable_leave()->set_reason("done");
  REQUIRE(s.send(leave));
  CHECK(s.waitClosed(kReply));
}

// Session that sends one message and must get a fatal rejection with `code`.
inline pb::Rejected rejectedJoin(const TestServer& server, const pb::AgentMessage& msg, pb::Rejected::Code code,
                          const std::optional<std::string>& token = std::nullopt) {
  Session s(server.address(), token);
  REQUIRE(s.send(msg));
  pb::Rejected r = expectRejected(s, code, /*fatal=*/true);
  s.finish();
  return r;
}

// A plain TCP client, for bytes that are not gRPC.
class RawConnection {
 public:
  explicit RawConnection(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd_ >= 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    REQUIRE(::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr) == 1);
    REQUIRE(::connect(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0);
    timeval tv{2, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  }
  ~RawConnection() { close(); }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  // False when the peer refused the bytes (it may have closed already).
  bool sendAll(const std::string& data) {
    size_t done = 0;
    while (done < data.size()) {
      ssize_t n = ::send(fd_, data.data() + done, data.size() - done, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        return false;
      }
      done += static_cast<size_t>(n);
    }
    return true;
  }

  // Reads and drops what the server sends until it closes the connection (true) or `timeout`.
  bool closedByPeerWithin(milliseconds timeout) {
    const auto end = Clock::now() + timeout;
    char buf[4096];
    for (;;) {
      auto left = std::chrono::duration_cast<milliseconds>(end - Clock::now()).count();
      if (left <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      int rc = ::poll(&p, 1, static_cast<int>(left));
      if (rc < 0 && errno == EINTR) continue;
      if (rc <= 0) return false;
      ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n == 0) return true;
      if (n < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        return true;  // reset
      }
    }
  }

  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

const std::string kHttp2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

inline std::string randomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string out(n, '\0');
  for (auto& c : out) c = static_cast<char>(rng() & 0xff);
  return out;
}

// Collects everything logged through spdlog's default logger while alive, at every level.
class LogCapture {
 public:
  class Sink : public spdlog::sinks::base_sink<std::mutex> {
   public:
    std::string text() {
      std::lock_guard<std::mutex> lock(mutex_);
      return text_;
    }

   protected:
    void sink_it_(const spdlog::details::log_msg& msg) override {
      text_.append(msg.payload.data(), msg.payload.size());
      text_ += '\n';
    }
    void flush_() override {}

   private:
    std::string text_;
  };

  LogCapture() : previous_(spdlog::default_logger()), sink_(std::make_shared<Sink>()) {
    // Kept alive for the whole executable: a gRPC thread may still hold the raw pointer.
    static std::vector<std::shared_ptr<spdlog::logger>> keep;
    auto logger = std::make_shared<spdlog::logger>("security-test-capture-" + std::to_string(keep.size()), sink_);
    logger->set_level(spdlog::level::trace);
    keep.push_back(logger);
    spdlog::set_default_logger(logger);
  }
  ~LogCapture() { spdlog::set_default_logger(previous_); }
  std::string text() { return sink_->text(); }

 private:
  std::shared_ptr<spdlog::logger> previous_;
  std::shared_ptr<Sink> sink_;
};

}  // namespace ddprun::test
