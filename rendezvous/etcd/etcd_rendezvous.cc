#include "rendezvous/etcd/etcd_rendezvous.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "common/error.h"
#include "ddprun/v1/etcd_rendezvous.pb.h"
#include "ddprun/v1/rendezvous.pb.h"
#include "etcd/etcd_watch.h"
#include "rendezvous/client/client_core.h"
#include "rendezvous/client/server_kind.h"
#include "rendezvous/etcd/etcd_driver.h"
#include "rendezvous/etcd/etcd_keys.h"
#include "rendezvous/wire/agent_proto.h"
#include "rendezvous/wire/notice_proto.h"
#include "tls/client.h"

namespace ddprun {

namespace pb = ddprun::v1;
using SteadyClock = std::chrono::steady_clock;

namespace {

// A transaction that puts `key` (on `lease`) only if it does not exist.
etcdserverpb::TxnRequest putIfAbsent(const std::string& key, const std::string& value, int64_t lease) {
  etcdserverpb::TxnRequest t;
  auto* cmp = t.add_compare();
  cmp->set_key(key);
  cmp->set_target(etcdserverpb::Compare::CREATE);
  cmp->set_result(etcdserverpb::Compare::EQUAL);
  cmp->set_create_revision(0);
  auto* put = t.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(value);
  put->set_lease(lease);
  return t;
}

}  // namespace

namespace {

class EtcdRendezvous final : public Rendezvous {
 public:
  EtcdRendezvous(EtcdRendezvousOptions options, ClientCore::Post post)
      : options_(std::move(options)),
        core_(std::move(post), options_.rules.heartbeatTimeout),
        client_(options_.client),
        keys_(options_.prefix, options_.runId) {
    for (const auto& e : options_.client.endpoints) storeAddr_ += (storeAddr_.empty() ? "etcd://" : ",") + e;
    // Rules travel in milliseconds (JobRules): compare and run them at that precision.
    pb::JobRules wire;
    toProto(options_.rules, &wire);
    options_.rules = fromProto(wire);
    if (auto invalid = RendezvousState::validateRules(options_.rules)) throw ConfigError(*invalid);
    heartbeat_ = std::chrono::duration_cast<std::chrono::milliseconds>(options_.rules.heartbeatTimeout);
  }

  // Leaves (revokes this node's lease, deleting its keys); the last node out deletes the job's keys.
  ~EtcdRendezvous() override { shutdown(); }

  // Joins on a thread of its own: etcd may take its whole retry budget to answer (or never), and
  // the agent's event loop must stay free for a signal meanwhile.
  void join(RendezvousListener* listener) override {
    DDPRUN_CHECK(listener != nullptr && !joined_, "join once, with a listener");
    joined_ = true;
    core_.setListener(listener);
    joiner_ = std::thread([this] {
      try {
        joinEtcd();
      } catch (const NotEtcdError& e) {
        // Not "etcd get:" with gRPC's empty reason: what answers there instead, when it can be told.
        TlsClientOptions tls{options_.client.tls, options_.client.caCertFile, options_.client.certFile,
                             options_.client.keyFile};
        fail(notAnEtcd(e.endpoint(), identifyServer(e.endpoint(), tls, std::chrono::milliseconds(2000)), e.detail()),
             kExitUsage);
      } catch (const ConfigError& e) {
        fail(std::string("etcd refused this node's configuration: ") + e.what(), kExitUsage);
      } catch (const Error& e) {
        // etcd unreachable (no member answered within the retry timeout): an infrastructure
        // failure, unless this node's TLS settings and etcd's do not match (a configuration
        // error: no retry mends it); or this node stops (the client was closed): nothing to say.
        if (stopping_) return;
        const std::string mismatch = tlsMismatch();
        if (!mismatch.empty()) {
          fail(mismatch, kExitUsage);
        } else {
          fail(std::string("cannot join the rendezvous on etcd: ") + e.what());
        }
      }
    });
  }

  // Why this node's TLS settings and etcd's do not match, in one line ("" when they do, or when
  // nothing can be told): as the gRPC backend says it (tls/client.h), asked of each member.
  std::string tlsMismatch() const {
    const auto& c = options_.client;
    for (const auto& endpoint : c.endpoints) {
      if (c.tls) {
        TlsClientOptions tls;
        tls.enabled = true;
        tls.caCertFile = c.caCertFile;
        tls.certFile = c.certFile;
        tls.keyFile = c.keyFile;
        const TlsProbeResult r = probeTls(endpoint, tls, std::chrono::milliseconds(2000));
        if (r.configError) return "etcd at " + endpoint + ": " + r.why;
      } else if (speaksTls(endpoint, std::chrono::milliseconds(1000))) {
        return "etcd at " + endpoint + " speaks TLS: give this node --rdzv_conf protocol=https,cacert=CA.pem "
               "(and cert=, key= where etcd asks for a client certificate)";
      }
    }
    return "";
  }

  // Runs on the joiner thread; the threads it starts are joined by shutdown() after it.
  void joinEtcd() {
    // etcd leases are whole seconds; a node is declared dead no earlier than its heartbeat timeout.
    jobLease_ = jobLease(ttl() * 2);
    driver_ = std::make_unique<EtcdDriver>(
        client_, EtcdDriverOptions{options_.runId, options_.nodeId, options_.rules, options_.prefix, jobLease_, heartbeat_}, stopping_);
    // This node's notices from now: the watch must exist before the join is written (no notice can
    // come earlier), and a watch from now gets each notice as it commits (EtcdWatch, kFromNow).
    // etcd creates it (on the watch's own thread) while the node lease is granted here. Not before
    // the job lease: that call finds a member that answers, which the watch then starts on (a
    // watch opened on a frozen member waits out its probe first).
    notices_ = std::make_unique<EtcdWatch>(client_, keys_.notices(options_.nodeId), etcdPrefixEnd(keys_.notices(options_.nodeId)),
                                           EtcdWatch::kFromNow);
    if (!putNode([this] { return waitWatchStarted(*notices_, stopping_).has_value(); }, /*elect=*/true)) return;  // stopping
    if (stopping_) return;
    threads_.emplace_back([this] { keepAlive(); });
    threads_.emplace_back([this] { follow(); });
    threads_.emplace_back([this] { elect(); });
    threads_.emplace_back([this] { writeReports(); });
    if (surplusLease_ != 0) {
      threads_.emplace_back([this, lease = surplusLease_] {
        try {
          client_.revokeLease(lease);
        } catch (const Error&) {
          // It holds no key and expires at its TTL.
        }
      });
    }
  }

  // etcd leases are whole seconds; a node is declared dead no earlier than its heartbeat timeout.
  std::chrono::seconds ttl() const { return std::chrono::seconds(std::max<int64_t>(2, (heartbeat_.count() + 999) / 1000)); }

  // A fresh node lease and this node's key on it: the driver reads a join (after the leave of
  // the old key, if it had one: etcd orders the two).
  // `beforePut`, when given, runs between the grant and the put; false from it: nothing is put.
  // `elect`: the node's first join also stands for driver in the same transaction (one raft entry
  // for both, not two in a row on the join's path); elect() starts from its outcome.
  bool putNode(const std::function<bool()>& beforePut = {}, bool elect = false) {
    auto sent = SteadyClock::now();
    int64_t lease = client_.grantLease(ttl());
    nodeLease_ = lease;
    renewed(sent);
    if (beforePut && !beforePut()) return false;
    pb::Join j;
    toProto(joinRequestOf(options_, core_.round()), &j);
    if (!elect) {
      client_.put(keys_.node(options_.nodeId), j.SerializeAsString(), lease);
      return true;
    }
    etcdserverpb::TxnRequest t = putIfAbsent(keys_.driver(), options_.nodeId, lease);
    for (auto* branch : {t.add_success(), t.add_failure()}) {
      auto* put = branch->mutable_request_put();
      put->set_key(keys_.node(options_.nodeId));
      put->set_value(j.SerializeAsString());
      put->set_lease(lease);
    }
    auto resp = client_.txn(t);
    firstElection_ = Election{resp.succeeded(), resp.header().revision()};
    return true;
  }

  // As the gRPC backend's: also true for the running round once etcd has been silent past the
  // agent's fence deadline, even before the renewal thread (maybe stuck in a call that waits for
  // its own deadline) has noticed: a worker the watchdog killed then is fenced, not a failure.
  uint64_t lastEventSeq() const override { return core_.lastEventSeq(); }
  bool fenced(uint64_t round) const override {
    return core_.fenced(round, lastRenewalDue(SteadyClock::now()));
  }

  // Queued for the writer thread, in order: the agent's event loop never waits for etcd.
  void report(const pb::AgentMessage& msg) {
    if (nodeLease_ == 0) return;  // not joined (yet): the driver knows nothing of this node to update
    {
      std::lock_guard<std::mutex> lock(mu_);
      reports_.emplace_back(keys_.event(options_.nodeId, ++eventSeq_), msg.SerializeAsString());
    }
    cv_.notify_all();
  }

  void writeReports() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      if (reports_.empty()) {
        cv_.wait(lock, [this] { return stopping_ || !reports_.empty(); });
        continue;
      }
      auto [key, value] = std::move(reports_.front());
      reports_.pop_front();
      lock.unlock();
      try {
        client_.put(key, value, nodeLease_);
      } catch (const Error& e) {
        if (!stopping_) spdlog::warn("rendezvous (etcd): cannot report to etcd: {}", e.what());
      }
      lock.lock();
    }
  }

  void reportWorkerFailure(uint64_t round, const WorkerFailure& failure) override {
    report(toProto(AgentReport::workerFailed(round, failure)));
  }
  void reportSucceeded(uint64_t round) override { report(toProto(AgentReport::succeeded(round))); }
  void reportStopped(uint64_t round) override { report(toProto(AgentReport::workersStopped(round))); }
  // Health goes as a heartbeat event (a raft write): only when it changed, at most every 2 s.
  void reportHealth(const NodeHealth& health) override {
    const auto now = SteadyClock::now();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (health == lastHealth_ || now - lastHealthAt_ < std::chrono::seconds(2)) return;
      lastHealth_ = health;
      lastHealthAt_ = now;
    }
    report(toProto(AgentReport::heartbeat(core_.round(), health)));
  }

  void reportRankFinished(uint64_t round, int rank) override {
    report(toProto(AgentReport::rankFinished(round, rank)));
  }
  void leave() override { report(toProto(AgentReport::leave("stopped by a signal"))); }

  // Within about a second whatever etcd does (a scheduler's SIGTERM must end ddprun in its grace):
  // calls in flight are cancelled, and the cleanup gets a short budget of its own.
  void shutdown() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_.exchange(true)) return;
    }
    cv_.notify_all();
    client_.cancel();
    if (joiner_.joinable()) joiner_.join();  // first: it is the thread that starts the others
    // The watches' threads end when their EtcdWatch goes; the follower and driver wake within a
    // wait step (kStep).
    for (auto& t : threads_) t.join();
    notices_.reset();
    if (nodeLease_ == 0) return;  // never joined: nothing of ours in etcd
    EtcdClientOptions cleanupOptions = options_.client;
    cleanupOptions.callTimeout = std::chrono::milliseconds(250);
    cleanupOptions.retryTimeout = std::chrono::milliseconds(500);
    try {
      // Leaving: the node's key goes with its lease now, so the driver sees this node leave at
      // once instead of after its TTL.
      EtcdClient cleanup(cleanupOptions);
      cleanup.revokeLease(nodeLease_);
      // The last node out removes the job: its state, notices and the workers' keys.
      if (cleanup.countPrefix(keys_.nodes()) == 0) {
        cleanup.deletePrefix(keys_.job());
        if (jobLease_ != 0) cleanup.revokeLease(jobLease_);
      }
    } catch (const Error& e) {
      spdlog::warn("rendezvous (etcd): cleanup incomplete ({}); leases expire on their own", e.what());
    }
  }

 private:
  static constexpr std::chrono::milliseconds kStep{100};  // how often a waiting thread checks stopping_

  // The job's lease: every agent renews it; the job's state and notices live on it, so they go
  // when every agent has died.
  int64_t jobLease(std::chrono::seconds ttl) {
    const std::string key = keys_.jobLease();
    for (;;) {
      if (auto kv = client_.get(key)) {
        if (client_.keepAliveOnce(kv->lease) > 0) return kv->lease;
        client_.deleteKey(key);  // a lease of an older job that expired
        continue;
      }
      int64_t lease = client_.grantLease(ttl);
      etcdserverpb::TxnRequest t = putIfAbsent(key, std::to_string(lease), lease);
      t.add_failure()->mutable_request_range()->set_key(key);
      auto resp = client_.txn(t);
      if (resp.succeeded()) return lease;
      // Another node of a job starting all at once won the race: its lease, fresh from its grant,
      // came back in the failure branch (no second read, no renewal on the join's path). Ours holds
      // nothing; it is revoked off the path (or expires at its TTL).
      const auto& ranged = resp.responses(0).response_range();
      if (ranged.kvs_size() == 1 && ranged.kvs(0).lease() != 0) {
        surplusLease_ = lease;
        return ranged.kvs(0).lease();
      }
      client_.revokeLease(lease);  // the winner's key went meanwhile: try again
    }
  }

  bool waitStopping(std::chrono::milliseconds d) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, d, [&] { return stopping_.load(); });
  }

  // The node's lease was renewed by a request sent at `sent`: etcd cannot expire it before
  // sent + TTL, and TTL >= H (whole seconds, rounded up), so the watchdog's deadline
  // sent + 13H/16 and the agent's own fence at sent + 5H/8 both come first (docs/rendezvous.md's
  // argument, with etcd's lease in place of the server's heartbeat clock).
  void renewed(SteadyClock::time_point sent) {
    lastRenewal_.store(sent.time_since_epoch().count());
    if (options_.onFenceDeadline) options_.onFenceDeadline(sent + core_.timing().watchdogKill);
  }

  // Renews both leases every H/8. A node whose lease expired was declared dead by etcd and the
  // others may go on without it: its workers are fenced and the job ends for it (exit 200).
  void keepAlive() {
    while (!waitStopping(core_.timing().heartbeatInterval)) {
      auto sent = SteadyClock::now();
      std::string lost;
      try {
        if (client_.keepAliveOnce(nodeLease_) == 0) {
          lost = "this node's etcd lease expired: the job may have gone on without it";
        } else {
          renewed(sent);
        }
      } catch (const Error& e) {
        spdlog::warn("rendezvous (etcd): lease renewal failed: {}", e.what());
      }
      // The job's lease is renewed whatever became of the node's: it holds the job's state and
      // notices. Gone, they are gone with it (every agent was cut off from etcd for its TTL), and
      // the job cannot go on: this node ends (exit 200) instead of waiting for notices that no
      // driver can write any more.
      try {
        if (client_.keepAliveOnce(jobLease_) == 0) {
          fail("the job's etcd lease expired (no agent renewed it for " + std::to_string(2 * ttl().count()) +
               " s): the job's rendezvous state is gone");
          return;
        }
      } catch (const Error& e) {
        spdlog::warn("rendezvous (etcd): job lease renewal failed: {}", e.what());
      }
      if (lost.empty() && lastRenewalDue(SteadyClock::now())) {
        lost = "etcd unreachable for " + std::to_string(core_.timing().agentFence.count()) + " ms: this node may be declared dead";
      }
      if (!lost.empty() && !rejoin(lost)) return;
    }
  }

  // As the gRPC backend (docs/rendezvous.md, "Fencing"): the workers of the running round are
  // killed now, and the node joins again as a newcomer of the next round within
  // 2 x heartbeat_timeout, else it ends with exit 200.
  bool rejoin(const std::string& why) {
    const uint64_t round = core_.round();
    core_.markFenced(round);
    if (round > 0) core_.postFenced(round, why, std::chrono::milliseconds(0));
    spdlog::warn("rendezvous (etcd): {}; joining again", why);
    const auto outcome = core_.rejoin(
        core_.openRejoinWindow(),
        [&] {
          try {
            // The old key goes first (its lease, if etcd still has it), so the driver reads a leave
            // and then a join, never a silent rewrite of a member's key.
            client_.revokeLease(nodeLease_);
            putNode();
            return true;
          } catch (const Error& e) {
            spdlog::warn("rendezvous (etcd): joining again failed: {}", e.what());
            return false;
          }
        },
        [this](std::chrono::milliseconds d) { return waitStopping(d); });
    if (outcome == ClientCore::Rejoin::kJoined) return true;
    if (outcome == ClientCore::Rejoin::kWindowPassed) fail(core_.rejoinFailed(why));
    return false;
  }

  // The job ends for this node; the workers of the running round are fenced first.
  void fail(const std::string& why, int exitStatus = kExitInfrastructure) { core_.fail(why, exitStatus, true); }

  // This node's notices, in order, to the agent's event loop.
  void follow() {
    const std::string prefix = keys_.notices(options_.nodeId);
    std::string last;  // the key of the last notice delivered (keys grow: seqKey)
    while (!stopping_ && !core_.closed()) {
      std::vector<mvccpb::Event> events;
      try {
        events = notices_->next(SteadyClock::now() + kStep);
      } catch (const EtcdCompacted& e) {
        // Notices stay until the job's lease goes: read those after the last one delivered, and
        // watch on from that read.
        spdlog::warn("rendezvous (etcd): {}; reading this node's notices again", e.what());
        try {
          int64_t revision = 0;
          for (auto& kv : client_.getPrefix(prefix, &revision)) {
            if (kv.key <= last) continue;
            mvccpb::Event ev;
            ev.set_type(mvccpb::Event::PUT);
            ev.mutable_kv()->set_key(kv.key);
            ev.mutable_kv()->set_value(kv.value);
            events.push_back(std::move(ev));
          }
          notices_ = std::make_unique<EtcdWatch>(client_, prefix, etcdPrefixEnd(prefix), revision);
        } catch (const Error& again) {
          fail(std::string("lost the rendezvous on etcd: ") + again.what());
          return;
        }
      } catch (const Error& e) {
        fail(std::string("lost the rendezvous on etcd: ") + e.what());
        return;
      }
      for (const auto& ev : events) {
        pb::ServerMessage msg;
        if (ev.type() != mvccpb::Event::PUT) continue;
        last = std::max(last, ev.kv().key());
        if (!msg.ParseFromString(ev.kv().value())) continue;
        if (!deliver(msg)) return;
      }
    }
  }

  // False when this node's notices are over (the job closed, or it was refused).
  bool deliver(const pb::ServerMessage& msg) {
    switch (core_.deliver(msg, storeAddr_)) {
      case ClientCore::Delivered::kClosed: return false;
      case ClientCore::Delivered::kRefused:
        fail("the rendezvous refused this node: " + msg.rejected().message(), exitStatusOfRefusal(msg.rejected().code()));
        return false;
      default: return true;
    }
  }

  // The election: whoever creates the driver key (on its own lease) drives; the others wait for
  // the key to go (its node's lease expired) and try again.
  void elect() {
    const std::string key = keys_.driver();
    // The join's transaction stood for driver already (putNode): go on from its outcome.
    std::optional<Election> first = firstElection_;
    while (!stopping_ && !core_.closed()) {
      try {
        if (first) {
          const Election e = *std::exchange(first, std::nullopt);
          if (e.won) {
            driveAndHandOver();
          } else {
            waitDriverGone(key, e.revision);
          }
          continue;
        }
        // A read first: a driver is nearly always there already (the job's first node drives),
        // and a read is no raft entry, while a put-if-absent is one even when its compare fails
        // (with N nodes starting together, N - 1 entries that every member fsyncs).
        int64_t revision = 0;
        if (client_.get(key, &revision)) {
          waitDriverGone(key, revision);
          continue;
        }
        etcdserverpb::TxnRequest t = putIfAbsent(key, options_.nodeId, nodeLease_);
        t.add_failure()->mutable_request_range()->set_key(key);
        auto resp = client_.txn(t);
        if (resp.succeeded()) {
          driveAndHandOver();
          continue;
        }
        waitDriverGone(key, resp.header().revision());
      } catch (const Error& e) {
        if (stopping_) return;
        spdlog::warn("rendezvous (etcd): election: {}", e.what());
        waitStopping(kStep);
      }
    }
  }

  // Drives until the job ends, this process stops, or it is no longer the driver; hands the
  // driver key over when its watch was lost.
  void driveAndHandOver() {
    EtcdDriver::End end = EtcdDriver::End::kWatchLost;
    try {
      end = driver_->drive();
    } catch (const Error& e) {
      spdlog::warn("rendezvous (etcd): driving failed: {}", e.what());
      waitStopping(kStep);
    }
    if (end == EtcdDriver::End::kWatchLost && !stopping_ && !core_.closed()) releaseDriver();
  }

  // Until the driver key, as of `revision`, is deleted (its node's lease expired, or it handed over).
  void waitDriverGone(const std::string& key, int64_t revision) {
    EtcdWatch watch(client_, key, "", revision);
    bool gone = false;
    while (!gone && !stopping_ && !core_.closed()) {
      for (const auto& ev : watch.next(SteadyClock::now() + kStep)) gone |= ev.type() == mvccpb::Event::DELETE;
    }
  }

  // A driver whose watch was lost (a compacted revision, or no member for the retry timeout)
  // hands over: it deletes its driver key, so that the next driver (maybe this node again, on
  // its next try) starts from etcd as a takeover does. The key is deleted only while it is
  // still this node's.
  void releaseDriver() {
    try {
      etcdserverpb::TxnRequest t = whileDriver(keys_, options_.nodeId);
      t.add_success()->mutable_request_delete_range()->set_key(keys_.driver());
      client_.txn(t);
    } catch (const Error& e) {
      spdlog::warn("rendezvous (etcd): cannot hand over driving: {}", e.what());
      waitStopping(kStep);
    }
  }

  EtcdRendezvousOptions options_;
  ClientCore core_;
  EtcdClient client_;
  const EtcdKeys keys_;
  std::string storeAddr_;
  std::chrono::milliseconds heartbeat_{5000};
  // When the last renewal that etcd answered was sent (steady clock ticks): read by fenced() on
  // the agent's thread, written by the renewal thread.
  std::atomic<SteadyClock::rep> lastRenewal_{0};

  bool lastRenewalDue(SteadyClock::time_point now) const {
    return now - SteadyClock::time_point(SteadyClock::duration(lastRenewal_.load())) > core_.timing().agentFence;
  }
  bool joined_ = false;
  int64_t jobLease_ = 0;
  int64_t surplusLease_ = 0;  // the job lease this node granted and lost the race with: revoked after the join
  // The outcome of the first join's stand for driver (putNode), for elect() to start from.
  struct Election {
    bool won = false;
    int64_t revision = 0;
  };
  std::optional<Election> firstElection_;
  std::atomic<int64_t> nodeLease_{0};  // replaced when the node joins again
  std::atomic<uint64_t> eventSeq_{0};
  std::unique_ptr<EtcdDriver> driver_;  // made once the job lease is known; used by elect() only
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::unique_ptr<EtcdWatch> notices_;
  std::deque<std::pair<std::string, std::string>> reports_;  // key, value; guarded by mu_
  NodeHealth lastHealth_;                                     // guarded by mu_
  SteadyClock::time_point lastHealthAt_{};
  std::thread joiner_;
  std::vector<std::thread> threads_;
};

}  // namespace

std::unique_ptr<Rendezvous> makeEtcdRendezvous(EtcdRendezvousOptions options, ClientCore::Post post) {
  return std::make_unique<EtcdRendezvous>(std::move(options), std::move(post));
}

}  // namespace ddprun
