// Bounds on what comes from the network, against a real RendezvousServer on loopback: no error
// echoes unbounded input (gRPC's 8 KB metadata limit would turn it into RESOURCE_EXHAUSTED and hide
// the real error), ids have a charset, hosts are hostnames or IP addresses, and nothing a client
// sends reaches the log as raw control characters. A client that breaks a bound loses that call
// only. Harness: rendezvous_test_harness.h.
#include <catch2/catch.hpp>

#include "rendezvous_test_harness.h"

using Catch::Matchers::Contains;
using namespace ddprun::test;

namespace {

// The longest status message any error may carry (well under gRPC's 8 KB metadata limit).
constexpr size_t kMaxErrorBytes = 1024;

std::unique_ptr<pb::Store::Stub> storeStub(const TestServer& server) {
  return pb::Store::NewStub(grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
}

void deadline(grpc::ClientContext& context) { context.set_deadline(std::chrono::system_clock::now() + kReply); }

bool hasControlBytes(const std::string& text) {
  for (unsigned char c : text) {
    if ((c < 0x20 && c != '\n') || c == 0x7f) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("bounds: a wait on many 4 KB keys times out with its real error, bounded", "[bounds]") {
  Watchdog dog(60s, "bounds: many keys");
  TestServer server;
  auto job = startRunningJob(server);
  auto stub = storeStub(server);
  pb::WaitRequest request;
  request.mutable_scope()->set_run_id(job->runId);
  request.mutable_scope()->set_round(job->round);
  for (int i = 0; i < 16; ++i) request.add_keys(std::string(4000, static_cast<char>('a' + i)));
  request.set_timeout_ms(200);
  grpc::ClientContext context;
  deadline(context);
  pb::WaitResponse response;
  grpc::Status status = stub->Wait(&context, request, &response);
  INFO("status " << static_cast<int>(status.error_code()) << ", " << status.error_message().size() << " bytes");
  CHECK(status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
  CHECK(status.error_message().size() <= kMaxErrorBytes);
  CHECK_THAT(status.error_message(), Contains("more"));
  requireUndisturbed(*job);
}

TEST_CASE("bounds: a 1 MB run id fails that call with a short INVALID_ARGUMENT, the channel serves on",
          "[bounds]") {
  Watchdog dog(60s, "bounds: huge run id");
  TestServer server;
  auto job = startRunningJob(server);
  auto stub = storeStub(server);
  const std::string huge(1 << 20, 'r');

  pb::CheckRequest check;
  check.mutable_scope()->set_run_id(huge);
  check.mutable_scope()->set_round(1);
  check.add_keys("k");
  grpc::ClientContext c1;
  deadline(c1);
  pb::CheckResponse checkResponse;
  grpc::Status status = stub->Check(&c1, check, &checkResponse);
  INFO("unary: " << static_cast<int>(status.error_code()) << ", " << status.error_message().size() << " bytes");
  CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(status.error_message().size() <= kMaxErrorBytes);
  CHECK_THAT(status.error_message(), Contains("run id"));

  // The same channel (the same HTTP/2 connection) still carries good calls.
  check.mutable_scope()->set_run_id(job->runId);
  check.mutable_scope()->set_round(job->round);
  grpc::ClientContext c2;
  deadline(c2);
  CHECK(stub->Check(&c2, check, &checkResponse).ok());

  // On a Session stream: the bad request fails alone and the stream answers the next one.
  grpc::ClientContext c3;
  deadline(c3);
  auto stream = stub->Session(&c3);
  pb::StoreRequest bad;
  bad.set_id(1);
  bad.mutable_check()->mutable_scope()->set_run_id(huge);
  bad.mutable_check()->mutable_scope()->set_round(1);
  bad.mutable_check()->add_keys("k");
  REQUIRE(stream->Write(bad));
  pb::StoreResponse answer;
  REQUIRE(stream->Read(&answer));
  CHECK(answer.id() == 1);
  CHECK(static_cast<grpc::StatusCode>(answer.status().code()) == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(answer.status().message().size() <= kMaxErrorBytes);
  pb::StoreRequest good = bad;
  good.set_id(2);
  good.mutable_check()->mutable_scope()->set_run_id(job->runId);
  good.mutable_check()->mutable_scope()->set_round(job->round);
  REQUIRE(stream->Write(good));
  REQUIRE(stream->Read(&answer));
  CHECK(answer.id() == 2);
  CHECK(answer.status().code() == 0);
  stream->WritesDone();
  CHECK(stream->Finish().ok());
  requireUndisturbed(*job);
}

TEST_CASE("identity: ids outside the charset and hosts that are not hostnames or addresses are refused",
          "[bounds]") {
  Watchdog dog(60s, "identity: charset");
  LogCapture logs;
  TestServer server;
  auto job = startRunningJob(server);
  auto base = [&] { return joinMessage("side", "node-x", jobRules(1, 1), 1); };
  struct Case {
    const char* what;
    pb::AgentMessage msg;
  };
  std::vector<Case> cases;
  for (std::string runId : {std::string("job\n[info] job 'x': node y joined"), std::string("job\x1b[31mred"),
                            std::string("a/round/2"), std::string("job id"), std::string(257, 'r')}) {
    auto m = base();
    m.mutable_join()->set_run_id(runId);
    cases.push_back({"run id", m});
  }
  for (std::string nodeId : {std::string("node\r\nfake"), std::string("node\x07"), std::string("n\x7f"), std::string("n\u00e9")}) {
    auto m = base();
    m.mutable_join()->set_node_id(nodeId);
    cases.push_back({"node id", m});
  }
  for (std::string host : {std::string("not a host"), std::string("evil\n.example"), std::string("-leading.dash"),
                           std::string("a..b"), std::string(254, 'h'), std::string("1.2.3.4:80")}) {
    auto m = base();
    m.mutable_join()->set_host(host);
    cases.push_back({"host", m});
  }
  for (auto& c : cases) {
    INFO("case: " << c.what << " " << c.msg.ShortDebugString().substr(0, 200));
    auto r = rejectedJoin(server, c.msg, pb::Rejected::MALFORMED);
    CHECK(r.message().size() <= kMaxErrorBytes);
    CHECK_FALSE(hasControlBytes(r.message()));
  }
  // Well-formed ids and hosts still join: names, IPv4, IPv6, Slurm- and UUID-style ids.
  int n = 0;
  for (std::string host : {"node-07.cluster.local", "192.0.2.7", "::1", "h"}) {
    auto m = joinMessage("ok-run_" + std::to_string(n++) + ".a:b@c+d=e", "host-1:4242:99", jobRules(1, 1), 1);
    m.mutable_join()->set_host(host);
    Session s(server.address());
    REQUIRE(s.send(m));
    auto assigned = expectAssigned(s);
    CHECK(assigned.master_addr() == host);
  }
  CHECK_FALSE(hasControlBytes(logs.text()));
  CHECK_THAT(logs.text(), !Contains("[info] job 'x'"));
  requireUndisturbed(*job);
}

TEST_CASE("identity: a leave reason with control characters is logged escaped", "[bounds]") {
  Watchdog dog(60s, "identity: leave reason");
  LogCapture logs;
  TestServer server;
  Session s(server.address());
  REQUIRE(s.send(joinMessage("leaver", "node-l", jobRules(1, 1), 1)));
  expectAssigned(s);
  pb::AgentMessage leave;
  leave.mutable_leave()->set_reason("bye\n\x1b[2Jcleared");
  REQUIRE(s.send(leave));
  CHECK(s.waitClosed(kReply));
  CHECK_FALSE(hasControlBytes(logs.text()));
  CHECK_THAT(logs.text(), !Contains("bye\n"));
  CHECK_THAT(logs.text(), Contains("cleared"));
}

TEST_CASE("identity: a reported address other than the connection's is warned about, or refused when required",
          "[bounds]") {
  Watchdog dog(60s, "identity: host match");
  {
    LogCapture logs;
    TestServer server;
    auto m = joinMessage("claims", "node-c", jobRules(1, 1), 1);
    m.mutable_join()->set_host("192.0.2.99");
    Session s(server.address());
    REQUIRE(s.send(m));
    CHECK(expectAssigned(s).master_addr() == "192.0.2.99");
    CHECK_THAT(logs.text(), Contains("reports host 192.0.2.99 but connected from 127.0.0.1"));
  }
  auto options = loopbackServer();
  options.requireHostMatch = true;
  TestServer strict(options);
  auto m = joinMessage("claims", "node-c", jobRules(1, 1), 1);
  m.mutable_join()->set_host("192.0.2.99");
  auto r = rejectedJoin(strict, m, pb::Rejected::MALFORMED);
  CHECK_THAT(r.message(), Contains("not the address 127.0.0.1"));
  // The connection's own address, in any spelling, and a host name (no lookup) are accepted.
  for (std::string host : {"127.0.0.1", "::ffff:127.0.0.1", "localhost"}) {
    auto ok = joinMessage("own-" + std::to_string(host.size()), "node-d", jobRules(1, 1), 1);
    ok.mutable_join()->set_host(host);
    Session s(strict.address());
    REQUIRE(s.send(ok));
    CHECK(expectAssigned(s).master_addr() == host);
  }
}
