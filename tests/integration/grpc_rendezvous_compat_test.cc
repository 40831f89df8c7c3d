// The agent's gRPC backend (rendezvous/client/grpc_rendezvous.h) against servers of two versions: one
// that holds the next round for WorkersStopped (RoundAssigned.awaits_stopped, the hand-over of
// docs/rendezvous.md) and an older one that does not know the message and would end the session
// on it ("empty or unknown message"). The agent sends the report only to the first.
#include <catch2/catch.hpp>

#include <algorithm>
#include <future>

#include "rendezvous/client/grpc_rendezvous.h"
#include "rendezvous_test_harness.h"

using namespace ddprun::test;

namespace {

// One round for whoever joins; records what the agent sends after its Join.
class RecordingServer final : public pb::Rendezvous::Service {
 public:
  explicit RecordingServer(bool awaitsStopped) : awaitsStopped_(awaitsStopped) {}

  grpc::Status Session(grpc::ServerContext*, grpc::ServerReaderWriter<pb::ServerMessage, pb::AgentMessage>* stream)
      override {
    pb::AgentMessage msg;
    while (stream->Read(&msg)) {
      if (msg.has_join()) {
        pb::ServerMessage out;
        auto* a = out.mutable_round_assigned();
        a->set_round(1);
        a->set_group_world_size(1);
        a->set_world_size(1);
        a->set_master_addr("127.0.0.1");
        a->set_master_port(29500);
        a->set_awaits_stopped(awaitsStopped_);
        stream->Write(out);
        continue;
      }
      std::lock_guard<std::mutex> lock(mu_);
      kinds_.push_back(msg.kind_case());
      cv_.notify_all();
    }
    return grpc::Status::OK;
  }

  // Waits until a message of `kind` arrived; returns every non-heartbeat kind seen by then.
  std::vector<pb::AgentMessage::KindCase> until(pb::AgentMessage::KindCase kind) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, kSafetyBound, [&] { return std::count(kinds_.begin(), kinds_.end(), kind) > 0; });
    std::vector<pb::AgentMessage::KindCase> out;
    for (auto k : kinds_) {
      if (k != pb::AgentMessage::kHeartbeat) out.push_back(k);
    }
    return out;
  }

 private:
  const bool awaitsStopped_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<pb::AgentMessage::KindCase> kinds_;
};

class RoundListener final : public ddprun::RendezvousListener {
 public:
  void onRoundReady(const ddprun::RoundInfo& round) override { ready_.set_value(round.round); }
  void onRoundInterrupted(uint64_t, const std::string&) override {}
  void onJobClosed(const ddprun::JobClosure&) override {}
  std::future<uint64_t> ready() { return ready_.get_future(); }

 private:
  std::promise<uint64_t> ready_;
};

// Joins `server` with an agent's backend, gets round 1, reports its workers stopped, then
// succeeded; returns what the server received.
std::vector<pb::AgentMessage::KindCase> reportsTo(RecordingServer& service) {
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  auto server = builder.BuildAndStart();
  REQUIRE(server);
  ddprun::GrpcRendezvousOptions o;
  o.endpoint = "127.0.0.1:" + std::to_string(port);
  o.runId = "compat";
  o.nodeId = "node-a";
  RoundListener listener;
  auto ready = listener.ready();
  std::vector<pb::AgentMessage::KindCase> seen;
  {
    auto rdzv = ddprun::makeGrpcRendezvous(o, [](std::function<void()> fn) { fn(); });
    rdzv->join(&listener);
    REQUIRE(ready.wait_for(kSafetyBound) == std::future_status::ready);
    CHECK(ready.get() == 1);
    rdzv->reportStopped(1);
    rdzv->reportSucceeded(1);
    seen = service.until(pb::AgentMessage::kSucceeded);
  }
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return seen;
}

}  // namespace

TEST_CASE("grpc rendezvous: WorkersStopped goes only to a server that awaits it", "[rendezvous]") {
  Watchdog dog(60s, "grpc rendezvous compat");
  SECTION("a server with the hand-over gets the report") {
    RecordingServer server(true);
    CHECK(reportsTo(server) == std::vector<pb::AgentMessage::KindCase>{pb::AgentMessage::kWorkersStopped,
                                                                      pb::AgentMessage::kSucceeded});
  }
  SECTION("an older server is not sent a message it would end the session on") {
    RecordingServer server(false);
    CHECK(reportsTo(server) == std::vector<pb::AgentMessage::KindCase>{pb::AgentMessage::kSucceeded});
  }
}
