// The Store service's Session stream spoken directly (no StoreClient), over real gRPC on
// loopback: pipelining and out-of-order answers, per-request errors that leave the stream open,
// malformed and oversized input, the bound on pending waits, back-pressure on a client that does
// not read, and cleanup when a session ends or the service shuts down (many sessions with waits
// pending, clients that vanish); waits of many sessions answered from one another's sets.
#include <catch2/catch.hpp>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ddprun/v1/store.grpc.pb.h"
#include "rpc/grpc_util.h"
#include "store/grpc/store_service.h"
#include "safety_bound.h"

using namespace std::chrono_literals;
namespace v1 = ddprun::v1;
using Catch::Matchers::Contains;

namespace {

struct SessionServer {
  explicit SessionServer(ddprun::StoreCoreOptions options = {}) : core(std::move(options)), service(core) {
    grpc::ServerBuilder builder;
    ddprun::applyServerDefaults(builder);
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
    REQUIRE(server != nullptr);
  }
  ~SessionServer() {
    shutdown();
    server->Shutdown(std::chrono::system_clock::now() + 1s);
  }
  // As the rendezvous server shuts its store down: the waits end first, then the sessions.
  void shutdown() {
    core.shutdown();
    service.shutdown();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }

  ddprun::StoreCore core;
  ddprun::StoreService service;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

// One raw Session stream with a deadline (20 s unless given), so that a test that goes wrong
// cannot hang.
struct RawSession {
  explicit RawSession(const SessionServer& server, const std::string& token = "",
                      std::chrono::milliseconds deadline = 20s)
      : stub(v1::Store::NewStub(ddprun::makeChannel(server.address()))) {
    if (!token.empty()) context.AddMetadata(ddprun::kTokenMetadataKey, token);
    context.set_deadline(std::chrono::system_clock::now() + deadline);
    stream = stub->Session(&context);
  }
  void send(const v1::StoreRequest& request) { REQUIRE(stream->Write(request)); }
  v1::StoreResponse read() {
    v1::StoreResponse response;
    REQUIRE(stream->Read(&response));
    return response;
  }
  grpc::Status finish() {
    v1::StoreResponse ignored;
    while (stream->Read(&ignored)) {
    }
    return stream->Finish();
  }

  std::unique_ptr<v1::Store::Stub> stub;
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReaderWriter<v1::StoreRequest, v1::StoreResponse>> stream;
};

void scope(v1::Scope* s, uint64_t round = 1) {
  s->set_run_id("job");
  s->set_round(round);
}

v1::StoreRequest setRequest(uint64_t id, const std::string& key, const std::string& value) {
  v1::StoreRequest r;
  r.set_id(id);
  scope(r.mutable_set()->mutable_scope());
  r.mutable_set()->set_key(key);
  r.mutable_set()->set_value(value);
  return r;
}

v1::StoreRequest getRequest(uint64_t id, const std::string& key, uint32_t timeoutMs) {
  v1::StoreRequest r;
  r.set_id(id);
  scope(r.mutable_get()->mutable_scope());
  r.mutable_get()->set_key(key);
  r.mutable_get()->set_timeout_ms(timeoutMs);
  return r;
}

v1::StoreRequest addRequest(uint64_t id, const std::string& key, int64_t delta) {
  v1::StoreRequest r;
  r.set_id(id);
  scope(r.mutable_add()->mutable_scope());
  r.mutable_add()->set_key(key);
  r.mutable_add()->set_delta(delta);
  return r;
}

grpc::StatusCode codeOf(const v1::StoreResponse& r) {
  return static_cast<grpc::StatusCode>(r.status().code());
}

// Polls `done` every 10 ms for up to `limit`: for server-side effects no message reports.
template <typename F>
bool eventually(F&& done, std::chrono::milliseconds limit = 3s) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

}  // namespace

TEST_CASE("store session: pipelined requests, a waiting get answered out of order", "[store][session]") {
  SessionServer server;
  RawSession session(server);
  session.send(getRequest(1, "late", 10000));  // waits
  session.send(addRequest(2, "n", 5));
  session.send(setRequest(3, "late", "value"));  // satisfies request 1
  std::map<uint64_t, v1::StoreResponse> byId;
  for (int i = 0; i < 3; ++i) {
    auto r = session.read();
    byId[r.id()] = r;
  }
  // The add is answered before the get it was sent after.
  REQUIRE(byId.size() == 3);
  CHECK(codeOf(byId[1]) == grpc::StatusCode::OK);
  CHECK(byId[1].get().value() == "value");
  CHECK(byId[2].add().value() == 5);
  CHECK(byId[3].has_set());
  session.stream->WritesDone();
  CHECK(session.finish().ok());
}

TEST_CASE("store session: per-request errors leave the stream open", "[store][session]") {
  ddprun::StoreCoreOptions options;
  options.roundIsCurrent = [](const std::string&, uint64_t round) { return round == 1; };
  SessionServer server(options);
  RawSession session(server);

  v1::StoreRequest noOp;
  noOp.set_id(1);
  session.send(noOp);
  auto r = session.read();
  CHECK(r.id() == 1);
  CHECK(codeOf(r) == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(r.status().message(), Contains("no operation"));

  // A field this server does not know (a garbage oneof member) reads as no operation.
  v1::StoreRequest unknown;
  unknown.set_id(2);
  unknown.GetReflection()->MutableUnknownFields(&unknown)->AddLengthDelimited(99, "garbage");
  session.send(unknown);
  r = session.read();
  CHECK(r.id() == 2);
  CHECK(codeOf(r) == grpc::StatusCode::INVALID_ARGUMENT);

  v1::StoreRequest stale = addRequest(3, "n", 1);
  stale.mutable_add()->mutable_scope()->set_round(7);
  session.send(stale);
  r = session.read();
  CHECK(codeOf(r) == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK_THAT(r.status().message(), Contains("stale round 7"));

  session.send(setRequest(4, "", "v"));
  CHECK(codeOf(session.read()) == grpc::StatusCode::INVALID_ARGUMENT);
  session.send(setRequest(5, "big", std::string(ddprun::kMaxStoreValueBytes + 1, 'v')));
  r = session.read();
  CHECK(codeOf(r) == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_FALSE(r.has_set());
  session.send(setRequest(6, "text", "x"));
  session.read();
  session.send(addRequest(7, "text", 1));
  CHECK(codeOf(session.read()) == grpc::StatusCode::FAILED_PRECONDITION);  // not a number
  session.send(getRequest(8, "missing", 0));
  r = session.read();
  CHECK(codeOf(r) == grpc::StatusCode::DEADLINE_EXCEEDED);
  CHECK_THAT(r.status().message(), Contains("'missing'"));

  // Still open and working after all of that.
  session.send(addRequest(9, "n", 2));
  r = session.read();
  CHECK(r.id() == 9);
  CHECK(r.add().value() == 2);
}

TEST_CASE("store session: the token is checked when the stream opens", "[store][session]") {
  ddprun::StoreCoreOptions options;
  options.token = "s3cret";
  SessionServer server(options);
  {
    RawSession wrong(server, "nope");
    wrong.stream->Write(addRequest(1, "n", 1));  // may fail: the server is allowed to end first
    const auto status = wrong.finish();
    CHECK(status.error_code() == grpc::StatusCode::UNAUTHENTICATED);
  }
  RawSession right(server, "s3cret");
  right.send(addRequest(1, "n", 1));
  CHECK(right.read().add().value() == 1);
}

TEST_CASE("store session: undecodable and oversized messages end the stream, not the server",
          "[store][session]") {
  SessionServer server;
  SECTION("bytes that are no StoreRequest") {
    grpc::GenericStub generic(ddprun::makeChannel(server.address()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + 60s);  // beyond the safety bound below
    grpc::CompletionQueue cq;
    auto call = generic.PrepareCall(&context, "/ddprun.v1.Store/Session", &cq);
    void* tag = nullptr;
    bool ok = false;
    call->StartCall(reinterpret_cast<void*>(1));
    REQUIRE(cq.Next(&tag, &ok));
    grpc::Slice garbage(std::string("\xff\xff\xff\xff\x0f", 5));
    grpc::ByteBuffer buffer(&garbage, 1);
    call->Write(buffer, reinterpret_cast<void*>(2));
    REQUIRE(cq.Next(&tag, &ok));
    grpc::Status status;
    call->Finish(&status, reinterpret_cast<void*>(3));
    // gRPC reports a message it cannot decode to the reactor as the end of the reads, so the
    // session ends as after a half-close: at once (not at the deadline), with nothing answered.
    const auto start = std::chrono::steady_clock::now();
    while (cq.Next(&tag, &ok) && tag != reinterpret_cast<void*>(3)) {
    }
    CHECK(status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED);
    CHECK(std::chrono::steady_clock::now() - start < ddprun::test::kSafetyBound);
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
  }
  SECTION("a message over the limit") {
    RawSession session(server);
    session.stream->Write(setRequest(1, "huge", std::string(ddprun::kMaxMessageBytes + 1024, 'x')));
    CHECK(session.finish().error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  // The server serves on.
  RawSession next(server);
  next.send(addRequest(1, "n", 1));
  CHECK(next.read().add().value() == 1);
}

TEST_CASE("store session: pending waits are bounded per session", "[store][session]") {
  ddprun::StoreCoreOptions options;
  options.maxPendingPerConnection = 4;
  SessionServer server(options);
  RawSession session(server);
  for (uint64_t id = 1; id <= 5; ++id) session.send(getRequest(id, "k" + std::to_string(id), 10000));
  auto r = session.read();  // only the fifth can be answered now
  CHECK(r.id() == 5);
  CHECK(codeOf(r) == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK_THAT(r.status().message(), Contains("too many pending"));
  // The four waits are intact and answer once their keys exist.
  for (uint64_t id = 1; id <= 4; ++id) session.send(setRequest(100 + id, "k" + std::to_string(id), "v"));
  int answered = 0;
  for (int i = 0; i < 8; ++i) {
    r = session.read();
    CHECK(codeOf(r) == grpc::StatusCode::OK);
    if (r.id() <= 4) ++answered;
  }
  CHECK(answered == 4);
}

TEST_CASE("store session: a client that sends without reading is paused, then served in full",
          "[store][session]") {
  SessionServer server;
  RawSession session(server);
  constexpr int kRequests = 3000;  // well past the server's queue limit
  auto writer = std::async(std::launch::async, [&] {
    for (int i = 1; i <= kRequests; ++i) {
      if (!session.stream->Write(addRequest(static_cast<uint64_t>(i), "n", 1))) return false;
    }
    return true;
  });
  std::this_thread::sleep_for(200ms);  // let the queue fill: the point of the test
  int64_t last = 0;
  for (int i = 1; i <= kRequests; ++i) {
    auto r = session.read();
    CHECK(r.id() == static_cast<uint64_t>(i));  // quick operations answer in order
    last = r.add().value();
  }
  CHECK(writer.get());
  CHECK(last == kRequests);
}

TEST_CASE("store session: ending a session forgets its pending waits", "[store][session]") {
  SessionServer server;
  auto session = std::make_unique<RawSession>(server);
  session->send(getRequest(1, "never", 60000));
  session->send(addRequest(2, "n", 1));
  CHECK(session->read().id() == 2);  // so the get is registered by now
  REQUIRE(server.core.store().nextDeadline().has_value());
  session->context.TryCancel();
  session.reset();
  CHECK(eventually([&] { return !server.core.store().nextDeadline().has_value(); }));
}

TEST_CASE("store session: a half-closed session is answered, then finished", "[store][session]") {
  SessionServer server;
  RawSession session(server);
  session.send(getRequest(1, "never", 200));
  session.stream->WritesDone();
  auto r = session.read();
  CHECK(codeOf(r) == grpc::StatusCode::DEADLINE_EXCEEDED);
  CHECK(session.finish().ok());
}

TEST_CASE("store session: shutdown ends open sessions at once", "[store][session]") {
  SessionServer server;
  RawSession session(server);
  session.send(getRequest(1, "never", 60000));
  session.send(addRequest(2, "n", 1));
  CHECK(session.read().id() == 2);
  const auto start = std::chrono::steady_clock::now();
  server.shutdown();
  const auto status = session.finish();
  CHECK(status.error_code() == grpc::StatusCode::UNAVAILABLE);
  // Safety bounds: the pending get's deadline is 60 s away.
  CHECK(std::chrono::steady_clock::now() - start < ddprun::test::kSafetyBound);
  server.server->Shutdown();  // no deadline: returns because no session is left open
  CHECK(std::chrono::steady_clock::now() - start < ddprun::test::kSafetyBound);
  RawSession late(server);
  CHECK(late.finish().error_code() != grpc::StatusCode::OK);
}

TEST_CASE("store session: many sessions' waits are answered by other sessions' sets, concurrently",
          "[store][session]") {
  SessionServer server;
  constexpr int kWaiters = 12;
  std::vector<std::unique_ptr<RawSession>> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.push_back(std::make_unique<RawSession>(server));
    waiters.back()->send(getRequest(1, "k" + std::to_string(i), 20000));
    waiters.back()->send(addRequest(2, "registered", 1));
    CHECK(waiters.back()->read().id() == 2);  // so the get waits by now
  }
  // Setters on their own sessions, from their own threads, all at once.
  std::vector<std::future<void>> setters;
  for (int i = 0; i < kWaiters; ++i) {
    setters.push_back(std::async(std::launch::async, [&server, i] {
      RawSession setter(server);
      setter.send(setRequest(7, "k" + std::to_string(i), "v" + std::to_string(i)));
      CHECK(setter.read().id() == 7);
    }));
  }
  for (auto& s : setters) s.get();
  for (int i = 0; i < kWaiters; ++i) {
    auto r = waiters[i]->read();
    CHECK(r.id() == 1);
    CHECK(codeOf(r) == grpc::StatusCode::OK);
    CHECK(r.get().value() == "v" + std::to_string(i));
  }
  // A timeout, answered from the timer thread.
  waiters[0]->send(getRequest(3, "never", 50));
  CHECK(codeOf(waiters[0]->read()) == grpc::StatusCode::DEADLINE_EXCEEDED);
}

TEST_CASE("store session: shutdown with many sessions open and waits pending",
          "[store][session]") {
  auto server = std::make_unique<SessionServer>();
  std::vector<std::unique_ptr<RawSession>> sessions;
  for (int i = 0; i < 6; ++i) {
    sessions.push_back(std::make_unique<RawSession>(*server));
    for (uint64_t id = 1; id <= 3; ++id) sessions.back()->send(getRequest(id, "never" + std::to_string(id), 60000));
    sessions.back()->send(addRequest(9, "n", 1));
    CHECK(sessions.back()->read().id() == 9);
  }
  const auto start = std::chrono::steady_clock::now();
  server->shutdown();
  for (auto& s : sessions) CHECK(s->finish().error_code() == grpc::StatusCode::UNAVAILABLE);
  server->server->Shutdown();
  server.reset();
  CHECK(std::chrono::steady_clock::now() - start < ddprun::test::kSafetyBound);  // the waits' deadlines: 60 s
}

TEST_CASE("store session: the server's shutdown alone ends sessions with pending waits",
          "[store][session]") {
  auto server = std::make_unique<SessionServer>();
  RawSession session(*server);
  session.send(getRequest(1, "never", 60000));
  session.send(addRequest(2, "n", 1));
  CHECK(session.read().id() == 2);
  const auto start = std::chrono::steady_clock::now();
  server->server->Shutdown(std::chrono::system_clock::now() + 100ms);  // cancels the stream
  CHECK_FALSE(session.finish().ok());
  server.reset();
  CHECK(std::chrono::steady_clock::now() - start < ddprun::test::kSafetyBound);  // the wait's deadline: 60 s
}

TEST_CASE("store session: clients that vanish with waits pending leave a server that serves on",
          "[store][session]") {
  SessionServer server;
  for (int round = 0; round < 3; ++round) {
    std::vector<std::unique_ptr<RawSession>> gone;
    for (int i = 0; i < 6; ++i) {
      // Every third stream has a deadline that passes while its waits are pending.
      gone.push_back(std::make_unique<RawSession>(server, "", i % 3 == 2 ? 300ms : 20s));
      gone.back()->send(getRequest(1, "later", 60000));
      gone.back()->send(getRequest(2, "never", 60000));
      gone.back()->send(addRequest(3, "n", 1));
      CHECK(gone.back()->read().id() == 3);
    }
    CHECK(server.core.store().nextDeadline().has_value());
    gone[0]->context.TryCancel();  // cancelled
    gone[1].reset();               // dropped without a word (the call is cancelled underneath)
    std::this_thread::sleep_for(400ms);
    gone.clear();
    CHECK(eventually([&] { return !server.core.store().nextDeadline().has_value(); }));
  }
  // Their waits are forgotten; a set on the key they waited for finds nobody, and the server serves.
  RawSession setter(server);
  setter.send(setRequest(1, "later", "v"));
  CHECK(setter.read().id() == 1);
  RawSession next(server);
  next.send(getRequest(1, "later", 1000));
  CHECK(next.read().get().value() == "v");
}
