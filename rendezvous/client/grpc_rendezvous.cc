#include "rendezvous/client/grpc_rendezvous.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "common/atomic_max.h"
#include "common/error.h"
#include "common/exit_codes.h"
#include "ddprun/v1/rendezvous.grpc.pb.h"
#include "rendezvous/client/connect_probe.h"
#include "rendezvous/client/server_kind.h"
#include "rendezvous/wire/agent_proto.h"
#include "rendezvous/wire/notice_proto.h"
#include "rpc/grpc_runtime.h"
#include "rpc/grpc_util.h"
#include "tls/client.h"

namespace ddprun {
namespace {

namespace pb = ddprun::v1;
std::shared_ptr<grpc::Channel> makeChannel(const GrpcRendezvousOptions& o,
                                          std::shared_ptr<grpc::ChannelCredentials> credentials) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxRendezvousMessageBytes);
  args.SetMaxSendMessageSize(kMaxRendezvousMessageBytes);
  // A partitioned server must be noticed within about the heartbeat timeout, not TCP's minutes.
  // The ping's answer gets the whole timeout: a server that is only slow (1024 agents on 2 cores
  // in bench/) must not look dead, so detection takes between one and two heartbeat timeouts.
  auto heartbeatMs = std::chrono::duration_cast<std::chrono::milliseconds>(o.rules.heartbeatTimeout).count();
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, static_cast<int>(std::max<int64_t>(heartbeatMs / 2, 100)));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, static_cast<int>(std::max<int64_t>(heartbeatMs, 100)));
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return grpc::CreateCustomChannel(o.endpoint, std::move(credentials), args);
}

}  // namespace

namespace {

class GrpcRendezvous final : public Rendezvous {
 public:
  GrpcRendezvous(GrpcRendezvousOptions options, ClientCore::Post post)
      : options_(std::move(options)),
        core_(std::move(post), options_.rules.heartbeatTimeout),
        timing_(core_.timing()) {
    // Here, on the caller's thread, so that an unreadable cacert, cert or key is a ConfigError
    // the launcher reports (exit 2), not an exception escaping the reader thread (an abort).
    prepareGrpcRuntime();
    credentials_ = channelCredentials(options_.tls);
  }

  ~GrpcRendezvous() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    {
      std::lock_guard<std::mutex> lock(writeMu_);
      if (context_) context_->TryCancel();
    }
    if (reader_.joinable()) reader_.join();  // first: it is the thread that starts heartbeat_
    if (heartbeat_.joinable()) heartbeat_.join();
  }

  void join(RendezvousListener* listener) override {
    DDPRUN_CHECK(listener != nullptr, "join needs a listener");
    core_.setListener(listener);
    reader_ = std::thread([this] { run(); });
  }

  void reportWorkerFailure(uint64_t round, const WorkerFailure& failure) override {
    write(toProto(AgentReport::workerFailed(round, failure)));
  }

  void reportSucceeded(uint64_t round) override {
    // Workers that exited 0 need no fence: the node waits at the barrier.
    raiseTo(succeededRound_, round);
    write(toProto(AgentReport::succeeded(round)));
  }

  void reportStopped(uint64_t round) override {
    // An older server does not wait for it, and would end the session on a message it does not know.
    if (!awaitsStopped_.load()) return;
    write(toProto(AgentReport::workersStopped(round)));
  }

  void reportHealth(const NodeHealth& health) override {
    std::lock_guard<std::mutex> lock(healthMu_);
    if (health == lastHealthSent_) return;
    pendingHealth_ = health;
  }

  void reportRankFinished(uint64_t round, int rank) override {
    if (!relaysFinish_.load()) return;  // an older server: --finish_timeout stays node-local
    write(toProto(AgentReport::rankFinished(round, rank)));
  }

  // Order matters against updateContact(), which marks the round fenced before it refreshes the
  // contact: staleness is read first, so a worker killed while the contact was stale is seen as
  // fenced even if an answer arrived since.
  bool fenced(uint64_t round) const override { return core_.fenced(round, fencingDue(SteadyClock::now())); }
  uint64_t lastEventSeq() const override { return core_.lastEventSeq(); }

  void leave() override {
    leaving_ = true;
    write(toProto(AgentReport::leave("agent stopped by a signal")));
  }

 private:
  using SteadyClock = std::chrono::steady_clock;

  // How a session ended: the job is over for this node (closed, refused, left, stopping), or the
  // stream was lost and the node may join again.
  enum class SessionEnd { kOver, kLost };

  void run() {
    auto channel = makeChannel(options_, credentials_);
    if (!waitConnected(*channel, SteadyClock::now() + options_.connectTimeout)) {
      if (!stopped()) {
        // With what the last probe found (a silent port, one that closes at once...), if anything.
        core_.fail("cannot reach the rendezvous at " + options_.endpoint + " within " +
                   std::to_string(options_.connectTimeout.count() / 1000) + "s" +
                   (lastUnreachable_.empty() ? "" : ": " + lastUnreachable_));
      }
      return;
    }
    auto stub = pb::Rendezvous::NewStub(channel);
    heartbeat_ = std::thread([this] { heartbeatLoop(); });

    // A lost stream (a server restart, a connection reset, a short partition) is not the end of
    // the job: the server has dropped this node and restarted the others without it, so the
    // workers stop here too and the node joins again, as a newcomer that remembers its last
    // round (a restarted server that never had that round refuses it: STALE_ROUND). The window
    // covers a server that has not noticed the old stream's end yet (DUPLICATE_NODE until then).
    std::optional<SteadyClock::time_point> rejoinDeadline;
    std::string why;
    for (;;) {
      if (runSession(*stub, &why) == SessionEnd::kOver || stopped()) return;
      if (!rejoinDeadline || rejoinedRound_) {
        // Lost for the first time since the last round assignment: stop the workers, start over.
        rejoinedRound_ = false;
        rejoining_ = true;
        rejoinDeadline = core_.openRejoinWindow();
        spdlog::warn("lost the rendezvous at {} ({}); stopping workers and joining again", options_.endpoint, why);
        core_.postInterrupted(core_.round(), "lost the rendezvous: " + why);
      }
      const auto outcome = core_.rejoin(
          *rejoinDeadline,
          [&] {
            // Bounded: a server that accepts connections but never answers must not outlast the window.
            if (waitConnected(*channel, *rejoinDeadline)) return true;
            why = "cannot connect";
            return false;
          },
          [this](std::chrono::milliseconds d) {
            std::unique_lock<std::mutex> lock(mu_);
            return cv_.wait_for(lock, d, [this] { return stopping_; });
          });
      if (outcome == ClientCore::Rejoin::kStopped) return;
      if (outcome == ClientCore::Rejoin::kWindowPassed) {
        core_.fail(core_.rejoinFailed("lost the rendezvous at " + options_.endpoint + ": " + why));
        return;
      }
    }
  }

  // Whether the channel connects by `deadline`. gRPC's WaitForConnected cannot be interrupted, so
  // it waits in slices and gives up within one once the agent stops: a scheduler's SIGTERM must
  // not wait out a connect timeout (join_timeout, 600 s by default) or a rejoin window.
  // While it does not connect, it says why once it has tried for 2 s, and again when the reason
  // changes (a probe every 10 s): refused at the server's cap, nothing listening, no answer.
  bool waitConnected(grpc::Channel& channel, SteadyClock::time_point deadline) {
    constexpr auto kSlice = std::chrono::milliseconds(100);
    const auto started = SteadyClock::now();
    // With TLS the first failed slice probes at once: a TLS mismatch (a certificate) is a
    // configuration error that no retry mends, said at once with exit 2, as a wrong token is.
    auto nextProbe = started + (options_.tls.enabled ? std::chrono::seconds(0) : std::chrono::seconds(2));
    for (;;) {
      if (stopped()) return false;
      const auto now = SteadyClock::now();
      if (now >= deadline) return false;
      const auto slice = std::min<SteadyClock::duration>(deadline - now, kSlice);
      if (channel.WaitForConnected(std::chrono::system_clock::now() + slice)) return true;
      if (SteadyClock::now() >= nextProbe) {
        nextProbe = SteadyClock::now() + std::chrono::seconds(10);
        bool fatal = false;
        const std::string why = probe(&fatal);
        if (fatal) {
          core_.fail("cannot connect to the rendezvous at " + options_.endpoint + ": " + why, kExitUsage);
          return false;
        }
        if (!why.empty() && why != lastUnreachable_) {
          spdlog::warn("cannot connect to the rendezvous at {} yet: {}; still trying", options_.endpoint, why);
        }
        lastUnreachable_ = why;
      }
    }
  }

  // Why the server does not take this node's connection, in one line (empty: it does, or nothing
  // can be told); *fatal for a configuration error.
  std::string probe(bool* fatal) {
    if (options_.tls.enabled) {
      const TlsProbeResult r = probeTls(options_.endpoint, options_.tls, std::chrono::milliseconds(1000));
      *fatal = r.configError;
      if (r.connected) return "";
      return r.why.empty() ? whyUnreachable(options_.endpoint, std::chrono::milliseconds(500)) : r.why;
    }
    const Unreachable found = probeConnection(options_.endpoint, std::chrono::milliseconds(500));
    if (found.why.find(kTlsRequiredReason) != std::string::npos) {
      *fatal = true;
      return std::string(kTlsRequiredReason) + ": give this node --rdzv_conf protocol=https,cacert=CA.pem";
    }
    *fatal = found.foreign;  // an HTTP/1.x server there: not the rendezvous, whatever the retries
    return found.why;
  }

  // One Session stream: Join, then server pushes until it ends. `why` says why it ended.
  SessionEnd runSession(pb::Rendezvous::Stub& stub, std::string* why) {
    {
      std::lock_guard<std::mutex> lock(writeMu_);
      if (stopped()) return SessionEnd::kOver;
      context_ = std::make_unique<grpc::ClientContext>();  // one per call
      if (!options_.token.empty()) context_->AddMetadata(kTokenMetadataKey, options_.token);
      stream_ = stub.Session(context_.get());
      sessionOver_ = false;
      fenceCancelled_ = false;
    }
    duplicateNode_ = false;
    evicted_ = false;
    joinSent_ = SteadyClock::now();  // before the write: the server cannot have read it earlier
    write(joinMessage());
    pb::ServerMessage msg;
    bool over = false;
    while (stream_->Read(&msg)) {
      if (!handle(msg)) {
        over = !duplicateNode_ && !evicted_;
        break;
      }
    }
    {
      std::lock_guard<std::mutex> lock(writeMu_);
      sessionOver_ = true;  // no Write after Finish
    }
    grpc::Status status = stream_->Finish();
    if (over || core_.closed() || leaving_) return SessionEnd::kOver;
    if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
      // Not a lost connection: joining again would be refused again. Said at once, without the token.
      core_.fail("the rendezvous at " + options_.endpoint + " refused the job token (UNAUTHENTICATED): give this node "
           "the job's token (--rdzv_conf token_file=PATH or DDPRUN_RDZV_TOKEN)", kExitUsage);
      return SessionEnd::kOver;
    }
    if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
      // "unknown service ddprun.v1.Rendezvous": a gRPC server, but not ours (an etcd, most
      // likely). Joining again cannot help; said at once, with what it is when that can be told.
      const ServerKind kind = identifyServer(options_.endpoint, options_.tls, std::chrono::milliseconds(2000));
      if (kind != ServerKind::kDdprun) {
        core_.fail(notADdprunRendezvous(options_.endpoint, kind, status.error_message()), kExitUsage);
        return SessionEnd::kOver;
      }
    }
    *why = duplicateNode_ ? "the server still holds this node's previous session"
           : evicted_     ? evictedWhy_
           : fenceCancelled_.exchange(false)
               ? std::string("no answer to heartbeats for ") + std::to_string(timing_.agentFence.count()) + "ms"
               : (status.ok() ? std::string("the server closed the session") : status.error_message());
    return SessionEnd::kLost;
  }

  pb::AgentMessage joinMessage() const {
    pb::AgentMessage join;
    toProto(joinRequestOf(options_, core_.round()), join.mutable_join());
    return join;
  }

  // Returns false when the session is over.
  bool handle(const pb::ServerMessage& msg) {
    switch (msg.kind_case()) {
      case pb::ServerMessage::kRoundAssigned: {
        // The server read this session's Join before it assigned the round.
        updateContact(joinSent_);
        fencingOn_ = msg.round_assigned().acks_heartbeats();
        awaitsStopped_ = msg.round_assigned().awaits_stopped();
        relaysFinish_ = msg.round_assigned().relays_finish();
        core_.deliver(msg, options_.endpoint);
        rejoinedRound_ = true;
        return true;
      }
      case pb::ServerMessage::kRoundInterrupted:
      case pb::ServerMessage::kPeerFinished:
      case pb::ServerMessage::kJobHealth:
        core_.deliver(msg, options_.endpoint);
        return true;
      case pb::ServerMessage::kJobClosed:
        core_.deliver(msg, options_.endpoint);
        return false;
      case pb::ServerMessage::kHeartbeatAck: {
        std::optional<SteadyClock::time_point> sent;
        {
          std::lock_guard<std::mutex> lock(sentMu_);
          while (!sent_.empty() && sent_.front().first <= msg.heartbeat_ack().seq()) {
            if (sent_.front().first == msg.heartbeat_ack().seq()) sent = sent_.front().second;
            sent_.pop_front();
          }
        }
        if (sent) updateContact(*sent);
        return true;
      }
      case pb::ServerMessage::kRejected: {
        if (core_.deliver(msg, options_.endpoint) == ClientCore::Delivered::kWarning) return true;
        const auto& r = msg.rejected();
        if (r.code() == pb::Rejected::EVICTED || (r.code() == pb::Rejected::NOT_JOINED && core_.round() > 0)) {
          // The server declared this node dead and may already run a round without it: whatever
          // still runs here is killed now, and the node joins again as a newcomer.
          fence(core_.round(), "the rendezvous declared this node dead", std::chrono::milliseconds(0));
          evicted_ = true;
          evictedWhy_ = "the server declared this node dead (" + r.message() + ")";
          return false;
        }
        if (r.code() == pb::Rejected::DUPLICATE_NODE && rejoining_) {
          // Joining again before the server noticed the lost stream: try again shortly. (For a
          // fresh agent a duplicate id or static rank is a configuration error instead.)
          duplicateNode_ = true;
          return false;
        }
        // A duplicate while rejoining returned above: here it is this node's configuration.
        core_.fail("the rendezvous refused this node: " + r.message(), exitStatusOfRefusal(r.code()));
        return false;
      }
      default:
        return true;
    }
  }

  // Sends heartbeats, and fences the workers when the server has not answered one sent in the
  // last timing_.agentFence (docs/rendezvous.md, "Fencing").
  void heartbeatLoop() {
    auto nextBeat = SteadyClock::now() + timing_.heartbeatInterval;
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      auto wakeAt = nextBeat;
      if (auto due = fenceDue()) wakeAt = std::min(wakeAt, *due);
      if (cv_.wait_until(lock, wakeAt, [this] { return stopping_; })) break;
      lock.unlock();
      auto now = SteadyClock::now();
      if (now >= nextBeat) {
        std::optional<NodeHealth> health;
        {
          std::lock_guard<std::mutex> healthLock(healthMu_);
          if (pendingHealth_) lastHealthSent_ = *pendingHealth_;
          health = std::exchange(pendingHealth_, std::nullopt);
        }
        pb::AgentMessage msg = toProto(AgentReport::heartbeat(core_.round(), std::move(health)));
        {
          std::lock_guard<std::mutex> sentLock(sentMu_);
          msg.mutable_heartbeat()->set_seq(++heartbeatSeq_);
          sent_.emplace_back(heartbeatSeq_, now);  // before the write: the server reads it later
          if (sent_.size() > kMaxUnanswered) sent_.pop_front();
        }
        write(msg);
        nextBeat = now + timing_.heartbeatInterval;
      }
      if (fencingDue(SteadyClock::now())) {
        fence(core_.round(), "no answer from the rendezvous at " + options_.endpoint + " for " +
                          std::to_string(timing_.agentFence.count()) + "ms",
              timing_.agentKill - timing_.agentFence);
      }
      lock.lock();
    }
  }

  // When the workers of the current round must be fenced unless the server answers, if they may
  // run at all (a round with heartbeat answers, not fenced yet, not succeeded).
  std::optional<SteadyClock::time_point> fenceDue() const {
    const uint64_t round = core_.round();
    const int64_t contact = contactNs_.load();
    if (!fencingOn_.load() || round == 0 || contact == 0 || core_.fenced(round, false) ||
        succeededRound_.load() >= round) {
      return std::nullopt;
    }
    return SteadyClock::time_point(std::chrono::nanoseconds(contact)) + timing_.agentFence;
  }
  bool fencingDue(SteadyClock::time_point now) const {
    auto due = fenceDue();
    return due && now >= *due;
  }

  // The server had heard from this node by `sent` (it answered something sent then).
  void updateContact(SteadyClock::time_point sent) {
    // A contact that went stale is a fence even if the answer comes in now: the watchdog may
    // already have killed the workers (after a freeze of this process, for example).
    if (fencingDue(SteadyClock::now())) {
      fence(core_.round(), "no answer from the rendezvous for longer than " + std::to_string(timing_.agentFence.count()) + "ms",
            std::chrono::milliseconds(0));
    }
    const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(sent.time_since_epoch()).count();
    const int64_t prev = raiseTo(contactNs_, ns);
    if (prev < ns && options_.onFenceDeadline) options_.onFenceDeadline(sent + timing_.watchdogKill);
  }

  // Kills this node's workers of `round` within `killWithin` and ends the session, so that the
  // server moves on at once; the reader joins again as a newcomer.
  void fence(uint64_t round, const std::string& reason, std::chrono::milliseconds killWithin) {
    if (!core_.markFenced(round) || succeededRound_.load() >= round) return;
    spdlog::warn("fencing round {}: {}; its workers are killed within {}ms and this node joins again", round, reason,
                 killWithin.count());
    {
      std::lock_guard<std::mutex> lock(writeMu_);
      if (context_ && !sessionOver_) {
        fenceCancelled_ = true;
        context_->TryCancel();
      }
    }
    core_.postFenced(round, reason, killWithin);
  }

  // Writes on the current session; dropped between sessions (a new session starts with Join).
  void write(const pb::AgentMessage& msg) {
    std::lock_guard<std::mutex> lock(writeMu_);
    if (!stream_ || sessionOver_) return;
    if (!stream_->Write(msg)) spdlog::debug("rendezvous stream closed while writing");
  }

  bool stopped() {
    std::lock_guard<std::mutex> lock(mu_);
    return stopping_;
  }

  static constexpr size_t kMaxUnanswered = 64;

  GrpcRendezvousOptions options_;
  std::shared_ptr<grpc::ChannelCredentials> credentials_;
  ClientCore core_;
  const FenceTiming timing_;
  // Fencing state: written by the reader and heartbeat threads, read by the agent's loop too.
  std::atomic<int64_t> contactNs_{0};       // steady-clock send time of the last answered message
  std::atomic<bool> fencingOn_{false};      // the server answers heartbeats
  std::atomic<bool> awaitsStopped_{false};  // the server waits for WorkersStopped (the hand-over)
  std::atomic<bool> relaysFinish_{false};   // the server relays RankFinished (--finish_timeout)
  // The node's health for the next heartbeat (reportHealth), and the last one sent.
  std::mutex healthMu_;
  std::optional<NodeHealth> pendingHealth_;
  NodeHealth lastHealthSent_;
  std::atomic<uint64_t> succeededRound_{0};
  std::atomic<bool> fenceCancelled_{false};  // the session was cancelled by a fence
  std::mutex sentMu_;
  uint64_t heartbeatSeq_ = 0;                                     // guarded by sentMu_
  std::deque<std::pair<uint64_t, SteadyClock::time_point>> sent_;  // guarded by sentMu_
  SteadyClock::time_point joinSent_{};  // reader thread only
  std::string lastUnreachable_;         // reader thread only: what the last connect probe said
  bool evicted_ = false;                // reader thread only
  std::string evictedWhy_;              // reader thread only
  std::mutex writeMu_;
  std::unique_ptr<grpc::ClientContext> context_;  // the current session's; guarded by writeMu_
  std::unique_ptr<grpc::ClientReaderWriter<pb::AgentMessage, pb::ServerMessage>> stream_;
  bool sessionOver_ = false;  // guarded by writeMu_
  std::atomic<bool> leaving_{false};
  bool duplicateNode_ = false;  // reader thread only
  bool rejoining_ = false;      // reader thread only: the sessions after the first one
  bool rejoinedRound_ = false;  // reader thread only: a round was assigned since the last loss
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread reader_;
  std::thread heartbeat_;
};

}  // namespace

std::unique_ptr<Rendezvous> makeGrpcRendezvous(GrpcRendezvousOptions options, ClientCore::Post post) {
  return std::make_unique<GrpcRendezvous>(std::move(options), std::move(post));
}

}  // namespace ddprun
