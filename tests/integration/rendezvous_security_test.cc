// Security and bad input against a real RendezvousServer on loopback (port 0): the job token,
// fencing by round, duplicate and malformed joins, oversized messages, raw TCP garbage, the
// store's token and round checks, and a client that vanishes. Every test runs a well-formed
// 2-node job as its "running job" and checks after each disturbance that the job did not notice.
//
// Every client call has a deadline; a watchdog ends the executable if a test still runs after a
// minute (a server that hangs must fail the run, not stall it).
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
#include "rendezvous/grpc_util.h"
#include "rendezvous/rendezvous_server.h"
#include "rendezvous/store_client.h"

using namespace std::chrono_literals;
using Catch::Matchers::Contains;
using std::chrono::milliseconds;

namespace {

namespace pb = ddprun::v1;
using Clock = std::chrono::steady_clock;

// How long a reply the server owes may take (two shared cores, other builds running).
constexpr milliseconds kReply = 3s;
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
            std::fprintf(stderr, "rendezvous_security_test: '%s' still runs after %lld s: the server hangs\n",
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

// A real RendezvousServer on 127.0.0.1, any port; shut down when the test ends.
struct TestServer {
  explicit TestServer(std::string token = "") : server(ddprun::RendezvousServerOptions{"127.0.0.1", 0, std::move(token)}) {
    REQUIRE(server.port() > 0);
  }
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

std::string statusText(const grpc::Status& status) {
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
      queue_.push_back(msg);
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
  bool readDone_ = false;
  bool finished_ = false;
  grpc::Status status_;
  std::thread reader_;
};

pb::JobRules jobRules(int minNodes, int maxNodes, int maxRestarts = 1, uint32_t lastCallMs = 10000) {
  pb::JobRules r;
  r.set_min_nodes(minNodes);
  r.set_max_nodes(maxNodes);
  r.set_max_restarts(maxRestarts);
  r.set_join_timeout_ms(60000);
  r.set_last_call_timeout_ms(lastCallMs);
  r.set_heartbeat_timeout_ms(60000);
  return r;
}

pb::AgentMessage joinMessage(const std::string& runId, const std::string& nodeId, const pb::JobRules& rules,
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

pb::AgentMessage heartbeat(uint64_t round) {
  pb::AgentMessage msg;
  msg.mutable_heartbeat()->set_round(round);
  return msg;
}

pb::AgentMessage workerFailed(uint64_t round) {
  pb::AgentMessage msg;
  msg.mutable_worker_failed()->set_round(round);
  msg.mutable_worker_failed()->set_rank(0);
  msg.mutable_worker_failed()->set_exit_code(1);
  return msg;
}

pb::AgentMessage succeeded(uint64_t round) {
  pb::AgentMessage msg;
  msg.mutable_succeeded()->set_round(round);
  return msg;
}

// The next message, which must come within `timeout`; fails with the stream's status otherwise.
pb::ServerMessage expectMessage(Session& s, milliseconds timeout = kReply) {
  auto msg = s.next(timeout);
  if (!msg) {
    if (!s.isOpen()) FAIL("the stream ended without the expected message, status " << statusText(s.finish()));
    FAIL("no message within " << timeout.count() << " ms");
  }
  return *msg;
}

pb::RoundAssigned expectAssigned(Session& s, milliseconds timeout = kReply) {
  pb::ServerMessage msg = expectMessage(s, timeout);
  INFO("got " << msg.ShortDebugString());
  REQUIRE(msg.has_round_assigned());
  return msg.round_assigned();
}

pb::RoundInterrupted expectInterrupted(Session& s, milliseconds timeout = kReply) {
  pb::ServerMessage msg = expectMessage(s, timeout);
  INFO("got " << msg.ShortDebugString());
  REQUIRE(msg.has_round_interrupted());
  return msg.round_interrupted();
}

// A Rejected with this code and fatality; a fatal one must also end the stream.
pb::Rejected expectRejected(Session& s, pb::Rejected::Code code, bool fatal) {
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
grpc::Status storeCheck(const std::string& address, const std::optional<std::string>& token, const std::string& runId,
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

std::unique_ptr<RunningJob> startRunningJob(const TestServer& server, std::optional<std::string> token = std::nullopt) {
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

// The running job noticed nothing: both streams open, heartbeats accepted silently (a node the
// server forgot would be told NOT_JOINED), no interruption within kQuiet, and the store still
// serves its round.
void requireUndisturbed(RunningJob& job) {
  REQUIRE(job.a->isOpen());
  REQUIRE(job.b->isOpen());
  REQUIRE(job.a->send(heartbeat(job.round)));
  REQUIRE(job.b->send(heartbeat(job.round)));
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
void requireServesNewJob(const TestServer& server, const std::optional<std::string>& token = std::nullopt) {
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
pb::Rejected rejectedJoin(const TestServer& server, const pb::AgentMessage& msg, pb::Rejected::Code code,
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

std::string randomBytes(size_t n, uint32_t seed) {
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

}  // namespace

TEST_CASE("security: a well-formed 2-node job gets ranks 0 and 1", "[security]") {
  Watchdog dog(60s, "baseline job");
  TestServer server;
  auto job = startRunningJob(server);
  const auto& a = job->assignedA;
  const auto& b = job->assignedB;
  INFO("node-a: " << a.ShortDebugString() << "\nnode-b: " << b.ShortDebugString());
  CHECK(a.round() == 1);
  CHECK(b.round() == 1);
  // Which node is rank 0 depends on which Join the server read first.
  CHECK(a.group_rank() + b.group_rank() == 1);
  CHECK(a.group_rank() != b.group_rank());
  CHECK(a.group_world_size() == 2);
  CHECK(b.group_world_size() == 2);
  CHECK(a.world_size() == 5);
  CHECK(b.world_size() == 5);
  const auto& first = a.group_rank() == 0 ? a : b;
  const auto& second = a.group_rank() == 0 ? b : a;
  const int firstWorkers = a.group_rank() == 0 ? 2 : 3;
  CHECK(first.rank_offset() == 0);
  CHECK(second.rank_offset() == firstWorkers);
  const int masterPort = a.group_rank() == 0 ? 29501 : 29502;
  CHECK(a.master_port() == masterPort);
  CHECK(b.master_port() == masterPort);
  CHECK(a.master_addr() == "127.0.0.1");
  CHECK(b.master_addr() == "127.0.0.1");
  CHECK(a.restart_count() == 0);
  CHECK(a.store_prefix() == "/run/job/round/1/");
  CHECK(b.store_prefix() == "/run/job/round/1/");
  requireUndisturbed(*job);
  job.reset();
  CHECK(server.stop() < 5s);
}

TEST_CASE("security: the job token is required, checked exactly, and never echoed or logged", "[security]") {
  Watchdog dog(60s, "job token");
  LogCapture logs;
  std::string everything;  // every status and message any client saw
  {
    TestServer server(kToken);
    auto job = startRunningJob(server, kToken);  // the right token works
    CHECK(job->assignedA.round() == 1);

    const std::vector<std::optional<std::string>> badTokens = {
        std::nullopt,            // no token metadata at all
        std::string(),           // empty value
        std::string("wrong"),    // plainly wrong
        kToken.substr(0, kToken.size() - 1),  // a prefix of the token
        kToken + "x",                         // the token plus a byte
        std::string("tok-7f3a9c1e5b2d4086-secreT"),  // differs in the last byte, same length
        std::string("TOK-7F3A9C1E5B2D4086-SECRET"),  // case matters
    };
    for (const auto& bad : badTokens) {
      INFO("token: " << (bad ? "'" + *bad + "'" : std::string("(none)")));
      Session s(server.address(), bad);
      // The Join is the running job's node id and run: if it got through it would be a duplicate.
      s.send(joinMessage(job->runId, "node-a", job->rules, 2));  // may fail: the server may end the call first
      REQUIRE(s.waitClosed(kReply));
      CHECK_FALSE(s.next(0ms).has_value());  // no protocol message to an unauthenticated client
      grpc::Status status = s.finish();
      INFO("status: " << statusText(status));
      CHECK(status.error_code() == grpc::StatusCode::UNAUTHENTICATED);
      CHECK_THAT(status.error_message(), Contains("token"));
      CHECK_THAT(status.error_message(), !Contains(kToken));
      everything += status.error_message() + "\n" + s.transcript();
    }
    requireUndisturbed(*job);

    // A client without the token cannot report for the running job either (e.g. a fake failure).
    {
      Session s(server.address(), std::string("wrong"));
      s.send(workerFailed(job->round));
      REQUIRE(s.waitClosed(kReply));
      grpc::Status status = s.finish();
      CHECK(status.error_code() == grpc::StatusCode::UNAUTHENTICATED);
      everything += status.error_message() + "\n" + s.transcript();
    }
    requireUndisturbed(*job);

    // The store too: a wrong or missing token fails with an error that names the token problem.
    for (const std::string& bad : {std::string("wrong"), std::string(), kToken.substr(1)}) {
      INFO("store token: '" << bad << "'");
      ddprun::StoreClientOptions o;
      o.address = server.address();
      o.token = bad;
      o.runId = job->runId;
      o.round = job->round;
      o.timeout = kReply;
      o.connectTimeout = kReply;
      std::string error = "no error";
      try {
        ddprun::StoreClient client(o);
        client.set("k", "v");
      } catch (const ddprun::ConnectionError& e) {
        error = e.what();
      } catch (const std::exception& e) {
        error = std::string("unexpected exception type: ") + e.what();
      }
      CHECK_THAT(error, Contains("token"));
      CHECK_THAT(error, !Contains("unexpected exception type"));
      CHECK_THAT(error, !Contains(kToken));
      everything += error + "\n";
    }
    requireServesNewJob(server, kToken);
    requireUndisturbed(*job);
    everything += job->a->transcript() + job->b->transcript();
    job.reset();
    CHECK(server.stop() < 5s);
  }
  CHECK_THAT(everything, !Contains(kToken));
  // Nothing the server logged holds the token, nor the near misses clients tried.
  const std::string logged = logs.text();
  CHECK_THAT(logged, !Contains(kToken));
  CHECK_THAT(logged, !Contains(kToken.substr(0, kToken.size() - 1)));
  CHECK_THAT(logged, !Contains("tok-7f3a9c1e5b2d4086-secreT"));
  CHECK_THAT(logged, !Contains("TOK-7F3A9C1E5B2D4086"));
}

TEST_CASE("security: a server without a token accepts a client that sends one", "[security]") {
  Watchdog dog(60s, "token on an open server");
  TestServer server;
  auto job = startRunningJob(server, std::string("any"));
  CHECK(job->round == 1);
  requireUndisturbed(*job);
}

TEST_CASE("security: another run id is another job, and the same run id with other rules is refused", "[security]") {
  Watchdog dog(60s, "run ids and rules");
  TestServer server;
  auto job = startRunningJob(server);

  // Another run id, even with the running job's node id and other rules: a separate job.
  {
    Session other(server.address());
    REQUIRE(other.send(joinMessage("other-job", "node-a", jobRules(1, 1, 0), 4)));
    auto assigned = expectAssigned(other);
    CHECK(assigned.round() == 1);
    CHECK(assigned.group_world_size() == 1);
    CHECK(assigned.world_size() == 4);
    CHECK(assigned.store_prefix() == "/run/other-job/round/1/");
    requireUndisturbed(*job);
    // Its store round is its own: the running job's round is still served too.
    CHECK(storeCheck(server.address(), std::nullopt, "other-job", 1).ok());
  }
  requireUndisturbed(*job);

  // The same run id with rules that differ in any field: RULES_MISMATCH, fatal to the newcomer.
  std::vector<pb::JobRules> variants;
  for (int field = 0; field < 6; ++field) {
    pb::JobRules r = job->rules;
    switch (field) {
      case 0: r.set_min_nodes(1); break;
      case 1: r.set_max_nodes(3); break;
      case 2: r.set_max_restarts(5); break;
      case 3: r.set_join_timeout_ms(r.join_timeout_ms() + 1); break;
      case 4: r.set_last_call_timeout_ms(r.last_call_timeout_ms() + 1); break;
      case 5: r.set_heartbeat_timeout_ms(r.heartbeat_timeout_ms() + 1); break;
    }
    variants.push_back(r);
  }
  for (const auto& r : variants) {
    INFO("rules: " << r.ShortDebugString());
    auto rejected = rejectedJoin(server, joinMessage(job->runId, "node-c", r, 1), pb::Rejected::RULES_MISMATCH);
    CHECK_THAT(rejected.message(), Contains(job->runId));
  }
  requireUndisturbed(*job);
  requireServesNewJob(server);
}

TEST_CASE("security: reports naming another round are refused without spending the budget", "[security]") {
  Watchdog dog(60s, "stale rounds");
  TestServer server;
  auto job = startRunningJob(server);  // max_restarts = 1
  const uint64_t round = job->round;

  // Older (0: before the first round), newer and far-off rounds: STALE_ROUND, not fatal.
  for (uint64_t stale : {round - 1, round + 1, round + 1000, uint64_t(~0ull)}) {
    INFO("stale round " << stale);
    REQUIRE(job->a->send(workerFailed(stale)));
    auto r = expectRejected(*job->a, pb::Rejected::STALE_ROUND, /*fatal=*/false);
    CHECK_THAT(r.message(), Contains("stale round"));
    REQUIRE(job->b->send(succeeded(stale)));
    expectRejected(*job->b, pb::Rejected::STALE_ROUND, /*fatal=*/false);
  }
  requireUndisturbed(*job);

  // A Join that says it ran in a round this server never had (the agent outlived a server
  // restart): fatal STALE_ROUND, and the running job does not notice.
  {
    auto msg = joinMessage(job->runId, "ghost", job->rules, 1);
    msg.mutable_join()->set_last_round(round + 5);
    msg.mutable_join()->set_has_last_round(true);
    auto r = rejectedJoin(server, msg, pb::Rejected::STALE_ROUND);
    CHECK_THAT(r.message(), Contains("stale round"));
  }
  {
    // The same against a run id this server has never seen (round 0).
    auto msg = joinMessage("restarted-job", "survivor", jobRules(1, 2), 1);
    msg.mutable_join()->set_last_round(3);
    msg.mutable_join()->set_has_last_round(true);
    rejectedJoin(server, msg, pb::Rejected::STALE_ROUND);
  }
  requireUndisturbed(*job);

  // The budget is untouched: with max_restarts = 1, one real failure still restarts the job
  // (a spent budget would close it instead).
  REQUIRE(job->a->send(workerFailed(round)));
  for (Session* s : {job->a.get(), job->b.get()}) {
    auto interrupted = expectInterrupted(*s);
    CHECK(interrupted.round() == round);
    auto assigned = expectAssigned(*s);
    CHECK(assigned.round() == round + 1);
    CHECK(assigned.restart_count() == 1);
  }
  job->round = round + 1;
  // The old round is now stale for reports and for the store.
  REQUIRE(job->b->send(workerFailed(round)));
  expectRejected(*job->b, pb::Rejected::STALE_ROUND, /*fatal=*/false);
  grpc::Status oldStore = storeCheck(server.address(), std::nullopt, job->runId, round);
  CHECK(oldStore.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK_THAT(oldStore.error_message(), Contains("stale round"));
  requireUndisturbed(*job);
}

TEST_CASE("security: a duplicate node id is refused to the newcomer only", "[security]") {
  Watchdog dog(60s, "duplicate node");
  TestServer server;
  auto job = startRunningJob(server);
  for (const char* id : {"node-a", "node-b"}) {
    INFO("duplicate of " << id);
    auto r = rejectedJoin(server, joinMessage(job->runId, id, job->rules, 1), pb::Rejected::DUPLICATE_NODE);
    CHECK_THAT(r.message(), Contains(id));
    requireUndisturbed(*job);
  }
  // Twice at once, racing each other.
  {
    Session d1(server.address()), d2(server.address());
    REQUIRE(d1.send(joinMessage(job->runId, "node-a", job->rules, 1)));
    REQUIRE(d2.send(joinMessage(job->runId, "node-a", job->rules, 1)));
    expectRejected(d1, pb::Rejected::DUPLICATE_NODE, true);
    expectRejected(d2, pb::Rejected::DUPLICATE_NODE, true);
  }
  requireUndisturbed(*job);

  // A static node rank that another live node holds is a duplicate too.
  {
    const auto rules = jobRules(2, 2);
    Session holder(server.address());
    auto msg = joinMessage("static-job", "static-0", rules, 1);
    msg.mutable_join()->set_node_rank(0);
    REQUIRE(holder.send(msg));
    REQUIRE_FALSE(holder.next(200ms).has_value());  // gathering, waits for its peer
    auto dup = joinMessage("static-job", "static-0-impostor", rules, 1);
    dup.mutable_join()->set_node_rank(0);
    rejectedJoin(server, dup, pb::Rejected::DUPLICATE_NODE);
    CHECK(holder.isOpen());
    // The holder still gets its round when the real peer arrives.
    Session peer(server.address());
    auto peerMsg = joinMessage("static-job", "static-1", rules, 1);
    peerMsg.mutable_join()->set_node_rank(1);
    REQUIRE(peer.send(peerMsg));
    CHECK(expectAssigned(holder).group_rank() == 0);
    CHECK(expectAssigned(peer).group_rank() == 1);
  }
  requireUndisturbed(*job);
}

TEST_CASE("security: malformed sessions are refused and end", "[security]") {
  Watchdog dog(60s, "malformed");
  TestServer server;
  auto job = startRunningJob(server);

  SECTION("messages before Join") {
    rejectedJoin(server, heartbeat(job->round), pb::Rejected::NOT_JOINED);
    rejectedJoin(server, workerFailed(job->round), pb::Rejected::NOT_JOINED);
    rejectedJoin(server, succeeded(job->round), pb::Rejected::NOT_JOINED);
    pb::AgentMessage leave;
    leave.mutable_leave()->set_reason("bye");
    rejectedJoin(server, leave, pb::Rejected::NOT_JOINED);
    rejectedJoin(server, pb::AgentMessage(), pb::Rejected::NOT_JOINED);  // empty AgentMessage
    requireUndisturbed(*job);
  }

  SECTION("invalid Join fields") {
    struct Case {
      const char* what;
      pb::AgentMessage msg;
    };
    auto base = [&] { return joinMessage(job->runId, "node-c", job->rules, 1); };
    std::vector<Case> cases;
    {
      auto m = base();
      m.mutable_join()->set_run_id("");
      cases.push_back({"empty run id", m});
    }
    {
      auto m = base();
      m.mutable_join()->set_node_id("");
      cases.push_back({"empty node id", m});
    }
    {
      auto m = base();
      m.mutable_join()->set_node_id(std::string(10 * 1024, 'n'));
      cases.push_back({"10 KB node id", m});
    }
    {
      auto m = base();
      m.mutable_join()->set_run_id(std::string(10 * 1024, 'r'));
      cases.push_back({"10 KB run id", m});
    }
    {
      auto m = base();
      m.mutable_join()->set_host(std::string(10 * 1024, 'h'));
      cases.push_back({"10 KB host", m});
    }
    for (int lws : {0, -1, 5000}) {
      auto m = base();
      m.mutable_join()->set_local_world_size(lws);
      cases.push_back({lws == 0 ? "local_world_size 0" : lws < 0 ? "local_world_size -1" : "local_world_size 5000", m});
    }
    for (int rank : {2, 3, -2}) {
      auto m = base();
      m.mutable_join()->set_node_rank(rank);
      cases.push_back({rank == 2 ? "node_rank == max_nodes" : rank == 3 ? "node_rank > max_nodes" : "node_rank -2", m});
    }
    for (int port : {-1, 65536}) {
      auto m = base();
      m.mutable_join()->set_master_port(port);
      cases.push_back({port < 0 ? "master_port -1" : "master_port 65536", m});
    }
    {
      auto m = base();
      m.mutable_join()->mutable_rules()->set_min_nodes(0);
      cases.push_back({"min_nodes 0", m});
    }
    {
      auto m = base();
      m.mutable_join()->mutable_rules()->set_min_nodes(3);
      m.mutable_join()->mutable_rules()->set_max_nodes(2);
      cases.push_back({"max_nodes < min_nodes", m});
    }
    {
      auto m = base();
      m.mutable_join()->mutable_rules()->set_min_nodes(-5);
      m.mutable_join()->mutable_rules()->set_max_nodes(-1);
      cases.push_back({"negative node counts", m});
    }
    {
      auto m = base();
      m.mutable_join()->mutable_rules()->set_max_restarts(-1);
      cases.push_back({"max_restarts -1", m});
    }
    {
      auto m = base();
      m.mutable_join()->mutable_rules()->set_join_timeout_ms(0);
      cases.push_back({"join_timeout 0", m});
    }
    {
      auto m = base();
      m.mutable_join()->mutable_rules()->set_heartbeat_timeout_ms(0);
      cases.push_back({"heartbeat_timeout 0", m});
    }
    {
      auto m = base();
      m.mutable_join()->clear_rules();
      cases.push_back({"no rules", m});
    }
    for (auto& c : cases) {
      INFO("case: " << c.what);
      auto r = rejectedJoin(server, c.msg, pb::Rejected::MALFORMED);
      CHECK(r.message().size() < 1024);  // a bad field is not echoed back in bulk
      REQUIRE(job->a->isOpen());
      REQUIRE(job->b->isOpen());
    }
    requireUndisturbed(*job);
  }

  SECTION("protocol errors after Join end that session only") {
    // A node of a job of its own: its Join is fine, then it misbehaves.
    auto misbehave = [&](const pb::AgentMessage& second, const std::string& runId) {
      Session s(server.address());
      REQUIRE(s.send(joinMessage(runId, "side-node", jobRules(1, 1), 1)));
      expectAssigned(s);
      REQUIRE(s.send(second));
      expectRejected(s, pb::Rejected::MALFORMED, /*fatal=*/true);
    };
    misbehave(pb::AgentMessage(), "side-1");  // empty AgentMessage after Join
    // A second Join on one session, here one that would add a node to the running job.
    misbehave(joinMessage(job->runId, "intruder", job->rules, 1), "side-2");
    misbehave(joinMessage("side-3", "side-node", jobRules(1, 1), 1), "side-3");  // the same Join again
    requireUndisturbed(*job);
  }

  requireServesNewJob(server);
}

TEST_CASE("security: oversized messages fail the call and the server keeps serving", "[security]") {
  Watchdog dog(60s, "oversized");
  TestServer server;
  auto job = startRunningJob(server);

  SECTION("a Join with a 10 MB node id") {
    Session big(server.address());
    big.send(joinMessage(job->runId, std::string(10 << 20, 'n'), job->rules, 1));  // may fail if refused early
    auto reply = big.next(10s);
    REQUIRE(big.waitClosed(10s));
    grpc::Status status = big.finish();
    INFO("reply: " << (reply ? reply->ShortDebugString().substr(0, 500) : std::string("(none)"))
                   << "; status: " << statusText(status));
    if (reply) {
      // Accepted by the transport (the server's limit is larger), refused by the rendezvous.
      REQUIRE(reply->has_rejected());
      CHECK(reply->rejected().code() == pb::Rejected::MALFORMED);
      CHECK(reply->rejected().fatal());
      CHECK(reply->ByteSizeLong() < 4096);  // not echoed back
    } else {
      CHECK(status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
    }
  }

  SECTION("a Join above the server's message limit") {
    Session big(server.address());
    big.send(joinMessage(job->runId, std::string(ddprun::kMaxMessageBytes + (1 << 20), 'n'), job->rules, 1));
    REQUIRE(big.waitClosed(20s));
    CHECK_FALSE(big.next(0ms).has_value());
    grpc::Status status = big.finish();
    INFO("status: " << statusText(status));
    CHECK(status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  }

  requireUndisturbed(*job);
  requireServesNewJob(server);
}

TEST_CASE("security: raw TCP garbage neither crashes the server nor disturbs jobs", "[security]") {
  Watchdog dog(60s, "TCP garbage");
  TestServer server;
  auto job = startRunningJob(server);

  // 4 KB of random bytes: the server drops the connection.
  {
    RawConnection c(server.port());
    c.sendAll(randomBytes(4096, 1234));
    CHECK(c.closedByPeerWithin(kReply));
  }
  requireUndisturbed(*job);
  requireServesNewJob(server);

  // A connection that sends nothing and stays for a second: others are served meanwhile.
  {
    RawConnection c(server.port());
    auto start = Clock::now();
    requireUndisturbed(*job);
    requireServesNewJob(server);
    std::this_thread::sleep_until(start + 1s);
  }
  requireUndisturbed(*job);

  // A truncated HTTP/2 preface, then silence, then gone.
  {
    RawConnection c(server.port());
    c.sendAll(kHttp2Preface.substr(0, 14));
    requireServesNewJob(server);
    std::this_thread::sleep_for(500ms);
  }
  // A truncated preface and an immediate close.
  {
    RawConnection c(server.port());
    c.sendAll(kHttp2Preface.substr(0, 20));
  }
  requireUndisturbed(*job);
  requireServesNewJob(server);

  // A valid preface followed by random frames; then plain HTTP/1.1.
  {
    RawConnection c(server.port());
    c.sendAll(kHttp2Preface + randomBytes(4096, 99));
    CHECK(c.closedByPeerWithin(kReply));
  }
  {
    RawConnection c(server.port());
    c.sendAll("GET / HTTP/1.1\r\nHost: localhost\r\n\r\n");
    CHECK(c.closedByPeerWithin(kReply));
  }
  requireUndisturbed(*job);

  // Many silent connections at once.
  {
    std::vector<std::unique_ptr<RawConnection>> idle;
    for (int i = 0; i < 64; ++i) idle.push_back(std::make_unique<RawConnection>(server.port()));
    requireServesNewJob(server);
    requireUndisturbed(*job);
  }
  requireServesNewJob(server);
  requireUndisturbed(*job);

  // Shutting down while a silent connection is still open is bounded.
  RawConnection lingering(server.port());
  job.reset();
  CHECK(server.stop() < 5s);
}

TEST_CASE("security: the store checks the job token and the round", "[security]") {
  Watchdog dog(60s, "store token and round");
  TestServer server(kToken);
  auto job = startRunningJob(server, kToken);
  auto options = [&](std::string token, uint64_t round, std::string runId = "job") {
    ddprun::StoreClientOptions o;
    o.address = server.address();
    o.token = std::move(token);
    o.runId = std::move(runId);
    o.round = round;
    o.timeout = kReply;
    o.connectTimeout = kReply;
    return o;
  };
  auto errorOf = [](const ddprun::StoreClientOptions& o, auto&& call) -> std::string {
    try {
      ddprun::StoreClient client(o);
      call(client);
    } catch (const std::exception& e) {
      return e.what();
    }
    return "no error";
  };
  auto setKey = [](ddprun::StoreClient& c) { c.set("k", "v"); };

  // A wrong token: the error names the token problem and not the token.
  std::string wrong = errorOf(options("not-the-token", job->round), setKey);
  CHECK_THAT(wrong, Contains("token") && !Contains(kToken));
  CHECK_THAT(errorOf(options("not-the-token", job->round), [](ddprun::StoreClient& c) { c.get("k"); }),
             Contains("token") && !Contains(kToken));

  // The right token and the running round: set and get work.
  {
    ddprun::StoreClient client(options(kToken, job->round));
    client.set("k", "v");
    CHECK(client.get("k") == "v");
    CHECK(client.add("n", 2) == 2);
    CHECK(client.numKeys() == 2);
  }

  // The right token, but a round that is not running (older or newer) or another run id.
  for (uint64_t round : {job->round - 1, job->round + 1}) {
    INFO("round " << round);
    std::string error;
    try {
      ddprun::StoreClient client(options(kToken, round));
      client.get("k");
      error = "no error";
    } catch (const ddprun::StateError& e) {
      error = e.what();
    } catch (const std::exception& e) {
      error = std::string("unexpected exception type: ") + e.what();
    }
    CHECK_THAT(error, Contains("stale round"));
  }
  CHECK_THAT(errorOf(options(kToken, job->round, "another-run"), setKey), Contains("stale round"));
  requireUndisturbed(*job);

  // After a restart, the old round's client is refused and the new round starts empty.
  ddprun::StoreClient oldRound(options(kToken, job->round));
  REQUIRE(job->b->send(workerFailed(job->round)));
  for (Session* s : {job->a.get(), job->b.get()}) {
    expectInterrupted(*s);
    CHECK(expectAssigned(*s).round() == job->round + 1);
  }
  CHECK_THROWS_WITH(oldRound.get("k"), Contains("stale round"));
  CHECK_THROWS_AS(oldRound.set("k", "again"), ddprun::StateError);
  job->round += 1;
  {
    ddprun::StoreClient client(options(kToken, job->round));
    CHECK_FALSE(client.check({"k"}));
    client.set("k", "new");
    CHECK(client.get("k") == "new");
  }
  requireUndisturbed(*job);
}

TEST_CASE("security: a client that disappears makes the others restart promptly", "[security]") {
  Watchdog dog(60s, "disappearing client");
  TestServer server;
  const auto rules = jobRules(1, 2, /*maxRestarts=*/0, /*lastCallMs=*/30000);
  Session a(server.address()), b(server.address());
  REQUIRE(a.send(joinMessage("elastic", "node-a", rules, 2, 29501)));
  REQUIRE(b.send(joinMessage("elastic", "node-b", rules, 4, 29502)));
  auto ra = expectAssigned(a);
  auto rb = expectAssigned(b);
  REQUIRE(ra.round() == 1);
  REQUIRE(rb.round() == 1);
  REQUIRE(ra.world_size() == 6);

  auto survivorSees = [&](Session& survivor, int workers, int port, auto&& vanish) {
    auto start = Clock::now();
    vanish();
    auto interrupted = expectInterrupted(survivor, 2s);
    auto assigned = expectAssigned(survivor, 2s - std::chrono::duration_cast<milliseconds>(Clock::now() - start));
    auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
    INFO("new round after " << took.count() << " ms: " << assigned.ShortDebugString());
    CHECK(took < 2s);
    CHECK(interrupted.round() == 1);
    CHECK(assigned.round() == 2);
    CHECK(assigned.group_rank() == 0);
    CHECK(assigned.group_world_size() == 1);
    CHECK(assigned.world_size() == workers);
    CHECK(assigned.rank_offset() == 0);
    CHECK(assigned.master_port() == port);
    CHECK(assigned.restart_count() == 0);  // a membership change does not spend the budget
    CHECK(survivor.isOpen());
  };

  SECTION("the call of node-b is cancelled") {
    survivorSees(a, 2, 29501, [&] { b.cancel(); });
  }
  SECTION("the call of node-a is cancelled") {
    survivorSees(b, 4, 29502, [&] { a.cancel(); });
  }
  SECTION("node-b half-closes its stream") {
    survivorSees(a, 2, 29501, [&] { b.halfClose(); });
  }
  // The survivor's job goes on: heartbeats are accepted and nothing more arrives.
  for (Session* s : {&a, &b}) {
    if (!s->isOpen()) continue;
    REQUIRE(s->send(heartbeat(2)));
    auto extra = s->next(kQuiet);
    if (extra) FAIL_CHECK("unexpected: " << extra->ShortDebugString());
    CHECK(s->isOpen());
  }
  CHECK(server.stop() < 5s);
}
