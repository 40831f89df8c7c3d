// The gRPC side of the rendezvous: one RendezvousState per run id, one bidirectional Session
// stream per agent, and a timer thread for the deadlines (last call, join timeout, heartbeats).
// Notices are pushed to agents as soon as an event produces them: no agent ever polls.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddprun/v1/rendezvous.grpc.pb.h"
#include "rendezvous/rules/job_event.h"
#include "rendezvous/rules/rules_host.h"  // StoreDrops

namespace ddprun {

struct RendezvousServiceOptions {
  std::string token;  // empty: unauthenticated
  // The two below run outside the service's lock (they may call roundIsCurrent), one at a time, in
  // the order the events happened, and before the messages of any later event reach agents.
  // What the rules host decided the workers' store drops (older rounds when a round starts, the
  // whole run when the job ends), ending their waits.
  std::function<void(const std::string& runId, const StoreDrops& drops)> onStoreDrops;
  // A finished job is forgotten (its last agent left, or a new run reuses its id), so the store
  // frees its keys.
  std::function<void(const std::string& runId)> onJobGone;
  // What happened to a job (job_event.h), and a heartbeat's gap since the node's previous
  // message: the daemon's metrics. Outside the service's lock, after the event's messages were
  // queued; one job's events in order when one thread handles them, not across threads.
  std::function<void(const std::string& runId, const std::vector<JobEvent>& events)> onEvents;
  std::function<void(Micros gap)> onHeartbeatGap;
  // What the Status call says this server is ("ddprun-rdzv 0.1.0", "agent-hosted").
  std::string serverName = "ddprun";
  // A job that no agent is connected to is forgotten after this long.
  std::chrono::milliseconds jobIdleTimeout{std::chrono::minutes(2)};
  // An agent may report its own address (--local_addr), which becomes MASTER_ADDR for the others
  // when it holds group rank 0. When it is an IP address other than the one the agent connected
  // from, the server warns; with this set, it refuses the join instead.
  bool requireHostMatch = false;
  // The client's IP address for gRPC's peer string of its call; unset, or when it returns "", the
  // address is read from the peer string itself ("ipv4:192.0.2.1:5000").
  std::function<std::string(const std::string& grpcPeer)> peerAddress;
  // Asked first for every call: may the call's connection go on (ConnectionListener::admitCall)?
  // When it may not, the call ends at once with RESOURCE_EXHAUSTED. Unset: every call may.
  std::function<bool(const std::string& grpcPeer, bool authenticated)> admitCall;
};

class RendezvousService final : public ddprun::v1::Rendezvous::CallbackService {
 public:
  explicit RendezvousService(RendezvousServiceOptions options);
  ~RendezvousService() override;

  grpc::ServerBidiReactor<ddprun::v1::AgentMessage, ddprun::v1::ServerMessage>* Session(
      grpc::CallbackServerContext* context) override;
  // Read-only: the jobs, their nodes and last failure (status_proto.h); the token rules of Session.
  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* context, const ddprun::v1::StatusRequest* request,
                                   ddprun::v1::StatusReply* reply) override;

  // For the store: is `round` the running round of `runId`?
  bool roundIsCurrent(const std::string& runId, uint64_t round) const;
  // For the store's messages: is there a job of that id (running, gathering, or just over)?
  bool jobExists(const std::string& runId) const;
  // Waits until no agent session is open, or until `timeout` passed. An agent hosting the server
  // calls it before exiting, so that the others read the job's end before the server goes away.
  bool waitIdle(std::chrono::milliseconds timeout);
  // Ends every session (agents see the stream close) and stops the timer; call before the
  // grpc::Server shuts down.
  void shutdown();
  // How many times the deadline thread has woken up. Each wake-up looks at every node of every
  // job, so it must not grow with the number of Joins (a test and the metrics read it).
  uint64_t timerWakeups() const;

  // What the metrics show of each job at a scrape (at most maxJobs, by run id).
  struct JobGauge {
    std::string runId;
    std::string phase;
    uint64_t round = 0;
    std::vector<std::pair<std::string, int>> nodesByState;  // status_proto.h's nodeStateName
    int agents = 0;                                         // sessions open
  };
  std::vector<JobGauge> jobGauges(std::size_t maxJobs) const;
  // Jobs held (gathering, running, or over and not forgotten yet).
  std::size_t jobCount() const;

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun
