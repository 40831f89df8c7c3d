// Security against a real RendezvousServer on loopback (port 0): the job token, run ids and
// rules, fencing by round, duplicate nodes. Every test runs a well-formed 2-node job as its
// "running job" and checks after each disturbance that the job did not notice. Harness:
// rendezvous_test_harness.h (deadlines on every call; a watchdog ends a hung test).
#include <catch2/catch.hpp>

#include "rendezvous_test_harness.h"

using Catch::Matchers::Contains;
using namespace ddprun::test;

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
  CHECK(server.stop() < kSafetyBound);
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
    CHECK(server.stop() < kSafetyBound);
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
