#include "rendezvous/server/rendezvous_service.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "rendezvous/rules/admission.h"
#include "rendezvous/rules/rules_host.h"
#include "rendezvous/wire/agent_proto.h"
#include "rendezvous/wire/notice_proto.h"
#include "rendezvous/wire/status_proto.h"
#include "rpc/grpc_util.h"

namespace ddprun {
namespace {

namespace pb = ddprun::v1;
using Clock = std::chrono::steady_clock;

Micros monotonicNow() {
  return std::chrono::duration_cast<Micros>(Clock::now().time_since_epoch());
}

pb::ServerMessage rejection(pb::Rejected::Code code, const std::string& message) {
  pb::ServerMessage msg;
  msg.mutable_rejected()->set_code(code);
  msg.mutable_rejected()->set_message(bounded(grpc::Status(grpc::StatusCode::UNKNOWN, message)).error_message());
  msg.mutable_rejected()->set_fatal(true);
  return msg;
}

// "ipv4:192.0.2.1:5000" -> "192.0.2.1"; "ipv6:[::1]:5000" or "ipv6:%5B::1%5D:5000" -> "::1".
std::string peerHost(const std::string& peer) {
  std::string rest = peer.substr(peer.find(':') + 1);
  for (auto [encoded, plain] : {std::pair{"%5B", "["}, std::pair{"%5D", "]"}}) {
    for (size_t pos; (pos = rest.find(encoded)) != std::string::npos;) rest.replace(pos, 3, plain);
  }
  if (!rest.empty() && rest[0] == '[') return rest.substr(1, rest.find(']') - 1);
  auto colon = rest.rfind(':');
  return colon == std::string::npos ? rest : rest.substr(0, colon);
}

std::string millis(Micros t) { return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(t).count()) + " ms"; }

}  // namespace

// One agent's stream. Messages to it may come from any thread; they are queued and written one at
// a time, as gRPC requires.
// Owned by a reference to itself until OnDone, and by whoever holds a message for it to flush, so
// that the service can write to it after releasing its lock.
class SessionReactor final : public grpc::ServerBidiReactor<pb::AgentMessage, pb::ServerMessage>,
                             public std::enable_shared_from_this<SessionReactor> {
 public:
  SessionReactor(RendezvousService::Impl* impl, std::string peerAddress)
      : impl_(impl), peerHost_(std::move(peerAddress)) {}

  void begin(std::shared_ptr<SessionReactor> self, bool authorized, bool admitted);
  // Queues a message (an empty one only closes); no gRPC call, so it may run under the service's
  // lock, which fixes the order of messages to one agent.
  void enqueue(pb::ServerMessage msg, bool finishAfter);
  // Starts writing what is queued (or finishes); never under the service's lock.
  void flush();
  void send(pb::ServerMessage msg, bool finishAfter) {
    enqueue(std::move(msg), finishAfter);
    flush();
  }

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

  std::string runId;
  std::string nodeId;
  bool joined = false;  // guarded by the service's mutex
  bool ended = false;   // guarded by the service's mutex
  // Why the service closes this session (a fatal refusal, an eviction), for the log line when its
  // stream ends; empty when the agent or the connection ended it. Guarded by the service's mutex.
  std::string closedBecause;

  const std::string& peer() const { return peerHost_; }

 private:
  void finishLocked(std::unique_lock<std::mutex>& lock, grpc::Status status);
  // Starts writing the next queued message, or finishes when asked and none is left; with mu_
  // held, which it releases before calling gRPC.
  void writeNextLocked(std::unique_lock<std::mutex>& lock);

  RendezvousService::Impl* impl_;
  std::string peerHost_;
  std::shared_ptr<SessionReactor> self_;  // released in OnDone
  pb::AgentMessage incoming_;
  std::mutex mu_;
  std::deque<pb::ServerMessage> queue_;
  bool writing_ = false;
  bool finishRequested_ = false;
  bool finished_ = false;
};

class RendezvousService::Impl {
 public:
  explicit Impl(RendezvousServiceOptions options) : options_(std::move(options)) {
    timer_ = std::thread([this] { timerLoop(); });
  }

  ~Impl() { shutdown(); }

  void shutdown() {
    Pending fx;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      stopping_ = true;
      for (SessionReactor* s : sessions_) {
        post(s, rejection(pb::Rejected::JOB_CLOSED, "rendezvous server is shutting down"), true, &fx);
      }
    }
    apply(fx);
    cv_.notify_all();
    if (timer_.joinable()) timer_.join();
  }

  bool authorized(const grpc::CallbackServerContext* context) const { return tokenAuthorized(*context, options_.token); }
  bool admitCall(const std::string& grpcPeer, bool authorized) const {
    return !options_.admitCall || options_.admitCall(grpcPeer, authorized);
  }

  std::string peerAddress(const std::string& grpcPeer) const {
    std::string address = options_.peerAddress ? options_.peerAddress(grpcPeer) : std::string();
    return address.empty() ? peerHost(grpcPeer) : address;
  }

  void added(SessionReactor* s) {
    std::lock_guard<std::mutex> lock(mu_);
    sessions_.insert(s);
  }

  // A message from an agent. Returns false when the session must stop reading.
  bool handle(SessionReactor* s, const pb::AgentMessage& msg) {
    Pending fx;
    bool keepReading = true;
    // A heartbeat that changed nothing only moves its node's deadline later: the timer thread
    // finds that out when the earlier deadline passes. Waking it on every heartbeat made it rescan
    // every node thousands of times a second with 1024 agents.
    bool deadlinesMayBeEarlier = true;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_ || s->ended) return false;
      if (!s->joined) {
        keepReading = handleJoin(s, msg, &fx, &deadlinesMayBeEarlier);
      } else {
        keepReading = handleReport(s, msg, &fx, &deadlinesMayBeEarlier);
      }
    }
    apply(fx);
    if (deadlinesMayBeEarlier) cv_.notify_all();
    return keepReading;
  }

  // The stream ended (closed, broken or cancelled): the node is gone.
  void ended(SessionReactor* s, const std::string& reason) {
    Pending fx;
    {
      std::lock_guard<std::mutex> lock(mu_);
      endLocked(s, reason, &fx);
    }
    apply(fx);
    cv_.notify_all();
  }

  void done(SessionReactor* s) {
    Pending fx;
    {
      std::lock_guard<std::mutex> lock(mu_);
      endLocked(s, "session finished", &fx);
      sessions_.erase(s);
      idleCv_.notify_all();
    }
    apply(fx);
    cv_.notify_all();
  }

  bool waitIdle(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return idleCv_.wait_for(lock, timeout, [this] { return sessions_.empty(); });
  }

  bool jobExists(const std::string& runId) const {
    std::lock_guard<std::mutex> lock(mu_);
    return jobs_.count(runId) != 0;
  }

  uint64_t timerWakeups() const { return timerWakeups_.load(std::memory_order_relaxed); }

  // Under mu_, so bounded: at most kStatusMaxJobs jobs, and kStatusMaxNodes nodes listed in all.
  grpc::Status status(const pb::StatusRequest& request, pb::StatusReply* reply) const {
    constexpr std::size_t kStatusMaxJobs = 1000;
    reply->set_server(options_.serverName);
    std::size_t nodesLeft = kStatusMaxNodes;
    const std::size_t perJob = statusNodeLimit(request.max_nodes());
    const Micros now = monotonicNow();
    std::lock_guard<std::mutex> lock(mu_);
    auto one = [&](const Job& job) {
      pb::JobStatus* out = reply->add_jobs();
      out->set_run_id(job.runId);
      toProto(job.host->state(), now, std::min(perJob, nodesLeft), job.host->lastFailure(), job.host->lastSeq(), out);
      out->set_agents_connected(static_cast<uint32_t>(job.sessions.size()));
      nodesLeft -= static_cast<std::size_t>(out->nodes_size());
    };
    if (!request.run_id().empty()) {
      auto it = jobs_.find(request.run_id());
      if (it == jobs_.end()) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no job '" + request.run_id() + "' here");
      one(it->second);
      return grpc::Status::OK;
    }
    for (const auto& [id, job] : jobs_) {
      if (static_cast<std::size_t>(reply->jobs_size()) >= kStatusMaxJobs) break;
      one(job);
    }
    return grpc::Status::OK;
  }

  std::vector<JobGauge> jobGauges(std::size_t maxJobs) const {
    std::vector<JobGauge> out;
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, job] : jobs_) {
      if (out.size() >= maxJobs) break;
      const RendezvousState& state = job.host->state();
      JobGauge g{id, phaseName(state.phase()), state.round(), {}, static_cast<int>(job.sessions.size())};
      const auto counts = state.nodeCountsByState();
      for (std::size_t i = 0; i < counts.size(); ++i) {
        g.nodesByState.emplace_back(nodeStateName(static_cast<RendezvousState::NodeState>(i)), counts[i]);
      }
      out.push_back(std::move(g));
    }
    return out;
  }

  std::size_t jobCount() const {
    std::lock_guard<std::mutex> lock(mu_);
    return jobs_.size();
  }

  bool roundIsCurrent(const std::string& runId, uint64_t round) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(runId);
    return it != jobs_.end() && it->second.host->state().isCurrentRound(round);
  }

 private:
  struct Job {
    std::string runId;
    std::unique_ptr<RulesHost> host;
    std::map<std::string, SessionReactor*> sessions;
    Micros idleSince{0};  // when its last session ended; meaningful while sessions is empty
    bool hadAgent = false;  // a node joined it (else its first Join was refused: nothing to keep)
  };

  Micros idleLimit() const { return std::chrono::duration_cast<Micros>(options_.jobIdleTimeout); }
  // What an event decided that must happen once mu_ is released: messages queued for sessions
  // (their writes), and the store's upkeep (in upkeep_). No store call, gRPC call or user callback
  // ever runs under mu_: a store callback asks roundIsCurrent(), which takes mu_.
  struct Pending {
    std::vector<std::shared_ptr<SessionReactor>> flush;
    std::vector<std::pair<std::string, std::vector<JobEvent>>> events;  // by run id, for onEvents
    std::vector<Micros> heartbeatGaps;
  };

  void post(SessionReactor* s, pb::ServerMessage msg, bool finish, Pending* fx) {
    s->enqueue(std::move(msg), finish);
    fx->flush.push_back(s->shared_from_this());
  }

  // Runs the upkeep decided so far, in the order it was decided, then writes the messages. Called
  // without mu_. Upkeep runs one action at a time, outside the lock; a thread that finds another
  // running waits for it, so that when this returns every action decided before this event's
  // messages is done (a new job's first round never reaches its agents before the old job's keys
  // of the same run id are gone).
  void apply(Pending& fx) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      for (;;) {
        if (upkeepRunning_) {
          upkeepCv_.wait(lock);
          continue;
        }
        if (upkeep_.empty()) break;
        auto action = std::move(upkeep_.front());
        upkeep_.pop_front();
        upkeepRunning_ = true;
        lock.unlock();
        try {
          action();
        } catch (const std::exception& e) {
          spdlog::error("rendezvous: store upkeep failed: {}", e.what());
        }
        lock.lock();
        upkeepRunning_ = false;
        upkeepCv_.notify_all();
      }
    }
    for (auto& s : fx.flush) s->flush();
    fx.flush.clear();
    if (options_.onEvents) {
      for (const auto& [runId, events] : fx.events) options_.onEvents(runId, events);
    }
    if (options_.onHeartbeatGap) {
      for (Micros gap : fx.heartbeatGaps) options_.onHeartbeatGap(gap);
    }
    fx.events.clear();
    fx.heartbeatGaps.clear();
  }

  void storeDropsLocked(const std::string& runId, const StoreDrops& drops) {
    if (options_.onStoreDrops) upkeep_.push_back([this, runId, drops] { options_.onStoreDrops(runId, drops); });
  }
  void jobGoneLocked(const std::string& runId) {
    if (options_.onJobGone) upkeep_.push_back([this, runId] { options_.onJobGone(runId); });
  }

  // *deadlinesMayBeEarlier: false for a plain Join (below), whose deadlines cannot be earlier than
  // the one the timer thread sleeps until; waking it for every Join made a gathering of N nodes
  // O(N^2) (each wake-up walks every node: bench/RESULTS_MULTINODE.md, finding 1).
  bool handleJoin(SessionReactor* s, const pb::AgentMessage& msg, Pending* fx, bool* deadlinesMayBeEarlier) {
    if (msg.kind_case() != pb::AgentMessage::kJoin) {
      post(s, rejection(pb::Rejected::NOT_JOINED, "the first message of a session must be Join"), true, fx);
      return false;
    }
    JoinOrigin origin;
    origin.peerHost = s->peer();
    origin.requireHostMatch = options_.requireHostMatch;
    auto admission = admit(joinRequestOf(msg.join()), origin);
    if (auto* refused = std::get_if<Rejection>(&admission)) {
      post(s, toProto("", Notice{"", *refused}, Liveness::kAnsweredHeartbeats), true, fx);
      return false;
    }
    const Admitted& admitted = std::get<Admitted>(admission);
    const std::string& runId = msg.join().run_id();
    if (!admitted.warning.empty()) spdlog::warn("job '{}': {}", runId, admitted.warning);
    Micros now = monotonicNow();
    auto it = jobs_.find(runId);
    if (it != jobs_.end() && it->second.host->state().phase() == RendezvousState::Phase::kClosed &&
        it->second.sessions.empty()) {
      jobs_.erase(it);  // a finished job of the same id: this is a new run, from round 1 again
      jobGoneLocked(runId);
      it = jobs_.end();
    }
    if (it == jobs_.end()) {
      it = jobs_.emplace(runId, Job{runId, std::make_unique<RulesHost>(runId, admitted.rules, now), {}}).first;
      spdlog::info("job '{}': {}..{} nodes, max_restarts {}", runId, admitted.rules.minNodes, admitted.rules.maxNodes,
                   admitted.rules.maxRestarts);
    }
    Job& job = it->second;
    // A plain Join: a node new to a gathering job that has sessions already, which neither ends
    // the gathering nor starts its last call. All it adds is its own heartbeat deadline, a full
    // timeout from now: if the timer thread sleeps until no later than that, it sees it then.
    // Anything else (a new job, a node id that replaces one, a last call, a round) may bring a
    // deadline earlier: the thread is woken.
    const RendezvousState& state = job.host->state();
    const bool gathering = state.phase() == RendezvousState::Phase::kGathering;
    const bool lastCall = state.lastCallStarted();
    const bool plain = gathering && !job.sessions.empty() && !state.hasNode(admitted.node.nodeId) &&
                       timerSleepsUntil_ && now + state.rules().heartbeatTimeout >= *timerSleepsUntil_;
    Effects joined = job.host->join(admitted, now);
    *deadlinesMayBeEarlier = !(plain && state.phase() == RendezvousState::Phase::kGathering &&
                               state.lastCallStarted() == lastCall);
    // A join's own rejection goes to this stream: the node id may belong to another live session.
    for (const auto& n : joined.notices) {
      if (n.nodeId == admitted.node.nodeId && std::holds_alternative<Rejection>(n.body)) {
        Notice refusal = n;
        auto& r = std::get<Rejection>(refusal.body);
        if (r.code == RejectCode::kRulesMismatch) {
          r.message += !job.sessions.empty() ? "; " + std::to_string(job.sessions.size()) + " agent(s) are in it"
                       : job.hadAgent   ? "; it has had no agent for " + millis(now - job.idleSince) +
                                            " and is forgotten after " + millis(idleLimit())
                                        : "; no agent is in it";
        }
        post(s, toProto(runId, refusal, Liveness::kAnsweredHeartbeats), true, fx);
        return false;
      }
    }
    s->runId = runId;
    s->nodeId = admitted.node.nodeId;
    s->joined = true;
    job.sessions[s->nodeId] = s;
    job.hadAgent = true;
    spdlog::info("job '{}': node {} joined ({} workers)", s->runId, s->nodeId, admitted.node.localWorldSize);
    dispatch(job, std::move(joined), fx);
    return true;
  }

  bool handleReport(SessionReactor* s, const pb::AgentMessage& msg, Pending* fx, bool* deadlinesMayBeEarlier) {
    auto it = jobs_.find(s->runId);
    if (it == jobs_.end()) return false;
    Job& job = it->second;
    auto report = reportOf(msg);
    if (!report) {
      post(s,
           rejection(pb::Rejected::MALFORMED, msg.kind_case() == pb::AgentMessage::kJoin
                                                  ? "Join sent twice on one session"
                                                  : "empty or unknown message"),
           true, fx);
      endLocked(s, "protocol error", fx);
      return false;
    }
    using Kind = AgentReport::Kind;
    if (report->kind == Kind::kWorkerFailed) {
      spdlog::info("job '{}': node {} reports that worker rank {} {} (round {})", s->runId, s->nodeId,
                   report->failure.rank, report->failure.description.empty() ? "failed" : report->failure.description,
                   report->round);
    }
    Effects out = job.host->report(s->nodeId, *report, monotonicNow());
    if (report->kind == Kind::kHeartbeat) {
      *deadlinesMayBeEarlier = !out.notices.empty();
      if (out.notices.empty()) {
        // The agent fences its workers when these stop coming (docs/rendezvous.md, "Fencing").
        pb::ServerMessage ack;
        ack.mutable_heartbeat_ack()->set_seq(msg.heartbeat().seq());
        post(s, std::move(ack), false, fx);
      }
    }
    if ((report->kind == Kind::kLeave || report->kind == Kind::kWorkersStopped) && !job.host->state().hasNode(s->nodeId)) {
      // It left, and its workers are gone (or none ran): its session is over.
      dispatch(job, std::move(out), fx);
      endLocked(s, report->kind == Kind::kLeave ? "left: " + report->reason : "left, its workers stopped", fx);
      post(s, pb::ServerMessage(), true, fx);  // an empty message closes the stream for the agent
      return false;
    }
    if (report->kind == Kind::kLeave) {
      // Out of the next round, which waits for its WorkersStopped: the session stays till then.
      spdlog::info("job '{}': node {} left: {}; waiting for its workers to stop", s->runId, s->nodeId, report->reason);
    }
    dispatch(job, std::move(out), fx);
    return !s->ended;
  }

  void endLocked(SessionReactor* s, const std::string& reason, Pending* fx) {
    if (s->ended) return;
    s->ended = true;
    if (!s->joined) return;
    auto it = jobs_.find(s->runId);
    if (it == jobs_.end()) return;
    Job& job = it->second;
    auto session = job.sessions.find(s->nodeId);
    if (session == job.sessions.end() || session->second != s) return;
    job.sessions.erase(session);
    if (job.sessions.empty()) job.idleSince = monotonicNow();
    spdlog::info("job '{}': node {} is gone ({})", s->runId, s->nodeId,
                 s->closedBecause.empty() ? reason : s->closedBecause);
    dispatch(job, job.host->leave(s->nodeId, reason, monotonicNow()), fx);
  }

  // Queues notices for their sessions; a fatal rejection or the end of the job closes the stream.
  // The store's drops are decided first, so they run before a new round reaches any agent.
  void dispatch(Job& job, Effects effects, Pending* fx) {
    if (effects.storeDrops.any()) storeDropsLocked(job.runId, effects.storeDrops);
    if (!effects.events.empty()) fx->events.emplace_back(job.runId, std::move(effects.events));
    if (effects.heartbeatGap) fx->heartbeatGaps.push_back(*effects.heartbeatGap);
    for (const auto& notice : effects.notices) {
      auto target = job.sessions.find(notice.nodeId);
      if (target == job.sessions.end()) continue;
      bool closes = std::holds_alternative<JobEnd>(notice.body);
      if (auto* r = std::get_if<Rejection>(&notice.body); r && r->fatal) {
        closes = true;
        target->second->closedBecause = r->message;  // "declared dead: no heartbeat for 5.0s", ...
      }
      post(target->second, toProto(job.runId, notice, Liveness::kAnsweredHeartbeats, job.host->state(), job.host->lastSeq()), closes, fx);
    }
  }

  // Applies deadlines; sleeps until the next one or until an event changes them. Everything the
  // loop acts on after its wait is also a reason not to wait (computed under mu_): an event that
  // came while this thread was in apply(), its notify lost, is seen here. (A closed job whose last
  // session ended then kept its store keys and pending waits for the idle limit: the teardown
  // test "the join timeout closes a job below min" caught it in CI.)
  void timerLoop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      std::optional<Micros> next;
      for (auto& [id, job] : jobs_) {
        auto d = job.host->state().nextDeadline();
        if (job.sessions.empty() && (!d || job.idleSince + idleLimit() < *d)) d = job.idleSince + idleLimit();
        if (job.host->state().phase() == RendezvousState::Phase::kClosed && job.sessions.empty()) d = Micros(0);  // gone now
        if (d && (!next || *d < *next)) next = d;
      }
      // What a plain Join compares with (handleJoin); none: sleeping without a deadline.
      timerSleepsUntil_ = next;
      if (next) {
        cv_.wait_until(lock, Clock::time_point(std::chrono::duration_cast<Clock::duration>(*next)));
      } else {
        cv_.wait_for(lock, std::chrono::seconds(60));
      }
      // Awake: the loop looks at every job before it sleeps again, so no event needs to wake it.
      timerSleepsUntil_ = Micros::min();
      timerWakeups_.fetch_add(1, std::memory_order_relaxed);
      if (stopping_) break;
      Micros now = monotonicNow();
      Pending fx;
      for (auto it = jobs_.begin(); it != jobs_.end();) {
        Job& job = it->second;
        auto d = job.host->state().nextDeadline();
        if (d && *d <= now) dispatch(job, job.host->tick(now), &fx);
        bool finished = job.host->state().phase() == RendezvousState::Phase::kClosed && job.sessions.empty();
        if (!finished && job.sessions.empty() && now >= job.idleSince + idleLimit()) {
          if (job.hadAgent) {
            spdlog::info("job '{}': forgotten after {} without an agent", job.runId, millis(now - job.idleSince));
          } else {
            spdlog::info("job '{}': forgotten (its first Join was refused, so no agent is in it)", job.runId);
          }
          finished = true;
        }
        if (finished) jobGoneLocked(job.runId);
        it = finished ? jobs_.erase(it) : std::next(it);
      }
      if (!fx.flush.empty() || !upkeep_.empty()) {
        lock.unlock();
        apply(fx);
        lock.lock();
      }
    }
  }

  RendezvousServiceOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Micros> timerSleepsUntil_ = Micros::min();  // under mu_: see timerLoop
  std::atomic<uint64_t> timerWakeups_{0};
  std::condition_variable idleCv_;
  std::map<std::string, Job> jobs_;
  std::set<SessionReactor*> sessions_;
  std::deque<std::function<void()>> upkeep_;  // store upkeep decided under mu_, run by apply()
  bool upkeepRunning_ = false;
  std::condition_variable upkeepCv_;
  bool stopping_ = false;
  std::thread timer_;
};

void SessionReactor::begin(std::shared_ptr<SessionReactor> self, bool authorized, bool admitted) {
  self_ = std::move(self);
  impl_->added(this);
  if (!admitted) {
    std::unique_lock<std::mutex> lock(mu_);
    finishLocked(lock, grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, kConnectionClosedForAbuse));
    return;
  }
  if (!authorized) {
    std::unique_lock<std::mutex> lock(mu_);
    finishLocked(lock, grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "invalid job token"));
    return;
  }
  StartRead(&incoming_);
}

void SessionReactor::enqueue(pb::ServerMessage msg, bool finishAfter) {
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_ || finishRequested_) return;
  bool closeOnly = msg.kind_case() == pb::ServerMessage::KIND_NOT_SET;
  // An agent that sends heartbeats and does not read must not grow the queue: a newer ack
  // replaces one that is queued and not being written (the front is, while writing_).
  const bool ack = msg.kind_case() == pb::ServerMessage::kHeartbeatAck;
  if (ack && !queue_.empty() && queue_.back().kind_case() == pb::ServerMessage::kHeartbeatAck &&
      (queue_.size() > 1 || !writing_)) {
    queue_.back() = std::move(msg);
    return;
  }
  if (!closeOnly) queue_.push_back(std::move(msg));
  if (finishAfter) finishRequested_ = true;
}

void SessionReactor::flush() {
  std::unique_lock<std::mutex> lock(mu_);
  if (finished_ || writing_) return;
  writeNextLocked(lock);
}

void SessionReactor::OnWriteDone(bool ok) {
  std::unique_lock<std::mutex> lock(mu_);
  queue_.pop_front();
  writing_ = false;
  if (!ok) {
    queue_.clear();
    finishLocked(lock, grpc::Status::OK);
    return;
  }
  writeNextLocked(lock);
}

void SessionReactor::writeNextLocked(std::unique_lock<std::mutex>& lock) {
  if (!queue_.empty()) {
    writing_ = true;
    const pb::ServerMessage* next = &queue_.front();
    lock.unlock();
    StartWrite(next);
    return;
  }
  if (finishRequested_) finishLocked(lock, grpc::Status::OK);
}

void SessionReactor::finishLocked(std::unique_lock<std::mutex>& lock, grpc::Status status) {
  if (finished_) return;
  finished_ = true;
  lock.unlock();
  Finish(bounded(status));
}

void SessionReactor::OnReadDone(bool ok) {
  if (!ok) {
    impl_->ended(this, "connection closed");
    send(pb::ServerMessage(), true);
    return;
  }
  if (impl_->handle(this, incoming_)) StartRead(&incoming_);
}

void SessionReactor::OnCancel() {
  impl_->ended(this, "connection lost");
  send(pb::ServerMessage(), true);  // even a cancelled RPC must be finished
}

void SessionReactor::OnDone() {
  impl_->done(this);
  auto last = std::move(self_);  // deletes this now, or when the last pending flush lets go
}

RendezvousService::RendezvousService(RendezvousServiceOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}
RendezvousService::~RendezvousService() = default;

grpc::ServerBidiReactor<pb::AgentMessage, pb::ServerMessage>* RendezvousService::Session(
    grpc::CallbackServerContext* context) {
  auto reactor = std::make_shared<SessionReactor>(impl_.get(), impl_->peerAddress(context->peer()));
  SessionReactor* raw = reactor.get();
  const bool authorized = impl_->authorized(context);
  raw->begin(std::move(reactor), authorized, impl_->admitCall(context->peer(), authorized));
  return raw;
}

grpc::ServerUnaryReactor* RendezvousService::Status(grpc::CallbackServerContext* context,
                                                    const pb::StatusRequest* request, pb::StatusReply* reply) {
  auto* reactor = context->DefaultReactor();
  const bool authorized = impl_->authorized(context);
  if (!impl_->admitCall(context->peer(), authorized)) {
    reactor->Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, kConnectionClosedForAbuse));
  } else if (!authorized) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "invalid job token"));
  } else {
    reactor->Finish(bounded(impl_->status(*request, reply)));
  }
  return reactor;
}

bool RendezvousService::roundIsCurrent(const std::string& runId, uint64_t round) const {
  return impl_->roundIsCurrent(runId, round);
}

bool RendezvousService::jobExists(const std::string& runId) const { return impl_->jobExists(runId); }

void RendezvousService::shutdown() { impl_->shutdown(); }

bool RendezvousService::waitIdle(std::chrono::milliseconds timeout) { return impl_->waitIdle(timeout); }

uint64_t RendezvousService::timerWakeups() const { return impl_->timerWakeups(); }

std::vector<RendezvousService::JobGauge> RendezvousService::jobGauges(std::size_t maxJobs) const {
  return impl_->jobGauges(maxJobs);
}

std::size_t RendezvousService::jobCount() const { return impl_->jobCount(); }

}  // namespace ddprun
