// Bad input against a real RendezvousServer on loopback (port 0): malformed sessions, oversized
// messages, raw TCP garbage, the store's token and round checks, and a client that vanishes. As
// in rendezvous_security_test.cc, a running 2-node job must not notice any of it.
#include <catch2/catch.hpp>

#include "rendezvous_test_harness.h"

using Catch::Matchers::Contains;
using namespace ddprun::test;

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

  // Shutting down while a silent connection is still open is bounded (far below the streams' 40 s).
  RawConnection lingering(server.port());
  job.reset();
  CHECK(server.stop() < kSafetyBound);
}

TEST_CASE("security: silent connections are closed after the handshake timeout, idle ones after the idle timeout",
          "[security]") {
  Watchdog dog(60s, "connection timeouts");
  ddprun::RendezvousServerOptions options = loopbackServer();
  options.handshakeTimeout = 500ms;
  options.idleTimeout = 1500ms;
  TestServer server(options);
  auto job = startRunningJob(server);

  // Connected, not a byte sent: closed once the handshake time is up, not before (nor after
  // gRPC's default of 120 s: the safety bound tells them apart).
  {
    RawConnection c(server.port());
    const auto start = Clock::now();
    CHECK(c.closedByPeerWithin(kSafetyBound));
    CHECK(Clock::now() - start >= 400ms);
  }
  // Half a preface, then silence: the same.
  {
    RawConnection c(server.port());
    c.sendAll(kHttp2Preface.substr(0, 14));
    CHECK(c.closedByPeerWithin(kSafetyBound));
  }
  // A complete handshake (preface and an empty SETTINGS frame), then no call: told to go away and
  // closed after the idle time (not the default 5 minutes).
  {
    RawConnection c(server.port());
    c.sendAll(kHttp2Preface + std::string("\0\0\0\4\0\0\0\0\0", 9));
    const auto start = Clock::now();
    CHECK(c.closedByPeerWithin(kSafetyBound));
    CHECK(Clock::now() - start >= 1s);
  }
  // The job's agents hold their session streams open all along: calls, never idle.
  requireUndisturbed(*job);
  requireServesNewJob(server);
}

TEST_CASE("security: a peer that stops answering is dropped after the keepalive", "[security]") {
  Watchdog dog(60s, "server keepalive");
  ddprun::RendezvousServerOptions options = loopbackServer();
  options.keepalive = 500ms;
  options.idleTimeout = 60s;  // not what closes it here
  TestServer server(options);
  auto job = startRunningJob(server);

  // A complete handshake, then nothing: the server's pings go unanswered and it hangs up. (A peer
  // host that lost power looks like this, and would otherwise hold its streams for good.) The
  // idle timeout (60 s) is longer than the safety bound: only the keepalive closes it in time.
  {
    RawConnection c(server.port());
    c.sendAll(kHttp2Preface + std::string("\0\0\0\4\0\0\0\0\0", 9));
    const auto start = Clock::now();
    CHECK(c.closedByPeerWithin(kSafetyBound));
    CHECK(Clock::now() - start >= 400ms);
  }
  // Live agents answer the pings (gRPC does it for them) and are undisturbed, past several keepalives.
  std::this_thread::sleep_for(2s);
  requireUndisturbed(*job);
  requireServesNewJob(server);
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
  // A job the server does not have is named as such, not as a stale round of it.
  CHECK_THAT(errorOf(options(kToken, job->round, "another-run"), setKey),
             Contains("no job 'another-run' on this rendezvous server"));
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

TEST_CASE("security: a client that disappears makes the others restart before any heartbeat timeout", "[security]") {
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

  // The heartbeat timeout is 60 s (jobRules): within the safety bound, only the vanished stream
  // itself can have told the server.
  auto survivorSees = [&](Session& survivor, int workers, int port, auto&& vanish) {
    auto start = Clock::now();
    vanish();
    auto interrupted = expectInterrupted(survivor, kSafetyBound);
    auto assigned = expectAssigned(survivor, kSafetyBound - std::chrono::duration_cast<milliseconds>(Clock::now() - start));
    INFO("new round: " << assigned.ShortDebugString());
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
  CHECK(server.stop() < kSafetyBound);
}
