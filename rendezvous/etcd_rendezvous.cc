#include "rendezvous/etcd_rendezvous.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <cinttypes>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "common/error.h"
#include "common/strings.h"
#include "ddprun/v1/etcd_rendezvous.pb.h"
#include "ddprun/v1/rendezvous.pb.h"
#include "rendezvous/etcd_records.h"
#include "rendezvous/notice_proto.h"
#include "rendezvous/grpc_rendezvous.h"  // FenceTiming
#include "rendezvous/worker_failure_message.h"
#include "store/etcd/etcd_watch.h"

namespace ddprun {

namespace pb = ddprun::v1;
using namespace etcd_records;  // NOLINT: the records of this backend, both ways
using SteadyClock = std::chrono::steady_clock;

namespace {

Micros monotonicNow() { return std::chrono::duration_cast<Micros>(SteadyClock::now().time_since_epoch()); }

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

std::string seqKey(uint64_t seq) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%020" PRIu64, seq);
  return buf;
}

}  // namespace

class EtcdRendezvous::Impl {
 public:
  Impl(EtcdRendezvousOptions options, Post post)
      : o_(std::move(options)), post_(std::move(post)), client_(o_.client) {
    std::string root = o_.prefix;
    while (!root.empty() && root.back() == '/') root.pop_back();
    jobPrefix_ = root + "/run/" + o_.runId + "/";
    rdzv_ = jobPrefix_ + "rdzv/";
    for (const auto& e : o_.client.endpoints) storeAddr_ += (storeAddr_.empty() ? "etcd://" : ",") + e;
    // Rules travel in milliseconds (JobRules): compare and run them at that precision.
    pb::JobRules wire;
    toProto(o_.rules, &wire);
    o_.rules = fromProto(wire);
    if (auto invalid = RendezvousState::validateRules(o_.rules)) throw ConfigError(*invalid);
    heartbeat_ = std::chrono::duration_cast<std::chrono::milliseconds>(o_.rules.heartbeatTimeout);
    timing_ = FenceTiming::forHeartbeatTimeout(o_.rules.heartbeatTimeout);
  }

  ~Impl() { shutdown(); }

  void join(RendezvousListener* listener) {
    DDPRUN_CHECK(listener != nullptr && listener_ == nullptr, "join once, with a listener");
    listener_ = listener;
    try {
      joinEtcd();
    } catch (const ConfigError& e) {
      fail(std::string("etcd refused this node's configuration: ") + e.what(), kExitUsage);
    } catch (const Error& e) {
      // etcd unreachable (no member answered within the retry timeout): an infrastructure failure.
      fail(std::string("cannot join the rendezvous on etcd: ") + e.what());
    }
  }

  void joinEtcd() {
    // etcd leases are whole seconds; a node is declared dead no earlier than its heartbeat timeout.
    jobLease_ = jobLease(ttl() * 2);
    int64_t revision = 0;
    client_.get(rdzv_ + "nodes/" + o_.nodeId, &revision);
    notices_ = std::make_unique<EtcdWatch>(client_, rdzv_ + "notices/" + o_.nodeId + "/",
                                           etcdPrefixEnd(rdzv_ + "notices/" + o_.nodeId + "/"), revision);
    putNode();
    threads_.emplace_back([this] { keepAlive(); });
    threads_.emplace_back([this] { follow(); });
    threads_.emplace_back([this] { elect(); });
  }

  // etcd leases are whole seconds; a node is declared dead no earlier than its heartbeat timeout.
  std::chrono::seconds ttl() const { return std::chrono::seconds(std::max<int64_t>(2, (heartbeat_.count() + 999) / 1000)); }

  // A fresh node lease and this node's key on it: the driver reads a join (after the leave of
  // the old key, if it had one: etcd orders the two).
  void putNode() {
    auto sent = SteadyClock::now();
    int64_t lease = client_.grantLease(ttl());
    nodeLease_ = lease;
    renewed(sent);
    pb::Join j;
    j.set_run_id(o_.runId);
    j.set_node_id(o_.nodeId);
    j.set_local_world_size(o_.localWorldSize);
    j.set_host(o_.host);
    j.set_master_port(o_.masterPort);
    j.set_node_rank(o_.nodeRank);
    j.set_last_round(round_);
    j.set_has_last_round(round_ > 0);
    j.set_reports_stopped(true);
    toProto(o_.rules, j.mutable_rules());
    client_.put(rdzv_ + "nodes/" + o_.nodeId, j.SerializeAsString(), lease);
  }

  // As the gRPC backend's: also true for the running round once etcd has been silent past the
  // agent's fence deadline, even before the renewal thread (maybe stuck in a call that waits for
  // its own deadline) has noticed: a worker the watchdog killed then is fenced, not a failure.
  bool fenced(uint64_t round) const {
    if (round == 0) return false;
    if (round == round_.load() && lastRenewalDue(SteadyClock::now())) return true;
    return round <= fencedThrough_.load();
  }

  void report(const pb::AgentMessage& msg) {
    if (nodeLease_ == 0) return;
    try {
      client_.put(rdzv_ + "events/" + o_.nodeId + "/" + seqKey(++eventSeq_), msg.SerializeAsString(), nodeLease_);
    } catch (const Error& e) {
      spdlog::warn("rendezvous (etcd): cannot report to etcd: {}", e.what());
    }
  }

  void leave() {
    pb::AgentMessage msg;
    msg.mutable_leave()->set_reason("stopped by a signal");
    report(msg);
  }

  void shutdown() {
    if (stopping_.exchange(true)) return;
    cv_.notify_all();
    // The watches' threads end when their EtcdWatch goes; the follower and driver wake within a
    // wait step (kStep).
    for (auto& t : threads_) t.join();
    notices_.reset();
    if (nodeLease_ == 0) return;  // never joined: nothing of ours in etcd
    try {
      client_.revokeLease(nodeLease_);
      // The last node out removes the job: its state, notices and the workers' keys.
      if (client_.countPrefix(rdzv_ + "nodes/") == 0) {
        client_.deletePrefix(jobPrefix_);
        if (jobLease_ != 0) client_.revokeLease(jobLease_);
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
    const std::string key = rdzv_ + "joblease";
    for (;;) {
      if (auto kv = client_.get(key)) {
        if (client_.keepAliveOnce(kv->lease) > 0) return kv->lease;
        client_.deleteKey(key);  // a lease of an older job that expired
        continue;
      }
      int64_t lease = client_.grantLease(ttl);
      if (client_.txn(putIfAbsent(key, std::to_string(lease), lease)).succeeded()) return lease;
      client_.revokeLease(lease);
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
    if (o_.onFenceDeadline) o_.onFenceDeadline(sent + timing_.watchdogKill);
  }

  // Renews both leases every H/8. A node whose lease expired was declared dead by etcd and the
  // others may go on without it: its workers are fenced and the job ends for it (exit 200).
  void keepAlive() {
    while (!waitStopping(timing_.heartbeatInterval)) {
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
        lost = "etcd unreachable for " + std::to_string(timing_.agentFence.count()) + " ms: this node may be declared dead";
      }
      if (!lost.empty() && !rejoin(lost)) return;
    }
  }

  // As the gRPC backend (docs/rendezvous.md, "Fencing"): the workers of the running round are
  // killed now, and the node joins again as a newcomer of the next round within
  // 2 x heartbeat_timeout, else it ends with exit 200.
  bool rejoin(const std::string& why) {
    uint64_t round = round_;
    uint64_t prev = fencedThrough_.load();
    while (prev < round && !fencedThrough_.compare_exchange_weak(prev, round)) {
    }
    if (round > 0) {
      post_([listener = listener_, round, why] { listener->onFenced(round, why, std::chrono::milliseconds(0)); });
    }
    spdlog::warn("rendezvous (etcd): {}; joining again", why);
    const auto deadline = SteadyClock::now() + 2 * heartbeat_;
    std::mt19937_64 rng{std::random_device{}()};
    auto backoff = std::chrono::milliseconds(50);
    while (!stopping_ && !closed_ && SteadyClock::now() < deadline) {
      try {
        // The old key goes first (its lease, if etcd still has it), so the driver reads a leave
        // and then a join, never a silent rewrite of a member's key.
        client_.revokeLease(nodeLease_);
        putNode();
        return true;
      } catch (const Error& e) {
        spdlog::warn("rendezvous (etcd): joining again failed: {}", e.what());
      }
      waitStopping(std::chrono::milliseconds(std::uniform_int_distribution<int64_t>(backoff.count() / 2, backoff.count())(rng)));
      backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
    }
    fail(why + "; could not join again within " + std::to_string(2 * heartbeat_.count()) + " ms");
    return false;
  }

  void fail(const std::string& why, int exitStatus = kExitInfrastructure) {
    if (closed_.exchange(true)) return;
    uint64_t round = round_;
    post_([listener = listener_, round, why, exitStatus] {
      if (round > 0) listener->onFenced(round, why, std::chrono::milliseconds(0));
      JobClosure c;
      c.outcome = JobOutcome::kFailed;
      c.reason = why;
      c.exitStatus = exitStatus;
      listener->onJobClosed(c);
    });
  }

  // This node's notices, in order, to the agent's event loop.
  void follow() {
    const std::string prefix = rdzv_ + "notices/" + o_.nodeId + "/";
    std::string last;  // the key of the last notice delivered (keys grow: seqKey)
    while (!stopping_ && !closed_) {
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

  bool deliver(const pb::ServerMessage& msg) {
    switch (msg.kind_case()) {
      case pb::ServerMessage::kRoundAssigned: {
        const auto& a = msg.round_assigned();
        RoundInfo info = roundInfoOf(a, storeAddr_);
        round_ = info.round;
        post_([listener = listener_, info] { listener->onRoundReady(info); });
        return true;
      }
      case pb::ServerMessage::kRoundInterrupted: {
        auto round = msg.round_interrupted().round();
        auto reason = msg.round_interrupted().reason();
        post_([listener = listener_, round, reason] { listener->onRoundInterrupted(round, reason); });
        return true;
      }
      case pb::ServerMessage::kJobClosed: {
        if (closed_.exchange(true)) return false;
        JobClosure closure = jobClosureOf(msg.job_closed());
        post_([listener = listener_, closure] { listener->onJobClosed(closure); });
        return false;
      }
      case pb::ServerMessage::kRejected:
        if (!msg.rejected().fatal()) {
          spdlog::warn("rendezvous (etcd): {}", msg.rejected().message());
          return true;
        }
        fail("the rendezvous refused this node: " + msg.rejected().message(), exitStatusOfRefusal(msg.rejected().code()));
        return false;
      default:
        return true;
    }
  }

  // The election: whoever creates the driver key (on its own lease) drives; the others wait for
  // the key to go (its node's lease expired) and try again.
  void elect() {
    const std::string key = rdzv_ + "driver";
    while (!stopping_ && !closed_) {
      try {
        etcdserverpb::TxnRequest t = putIfAbsent(key, o_.nodeId, nodeLease_);
        t.add_failure()->mutable_request_range()->set_key(key);
        auto resp = client_.txn(t);
        if (resp.succeeded()) {
          // Until the job ends, this process stops, or it is no longer the driver.
          DriveEnd end = DriveEnd::kWatchLost;
          try {
            end = drive();
          } catch (const Error& e) {
            spdlog::warn("rendezvous (etcd): driving failed: {}", e.what());
            waitStopping(kStep);
          }
          if (end == DriveEnd::kWatchLost && !stopping_ && !closed_) releaseDriver();
          continue;
        }
        EtcdWatch watch(client_, key, "", resp.header().revision());
        bool gone = false;
        while (!gone && !stopping_ && !closed_) {
          for (const auto& ev : watch.next(SteadyClock::now() + kStep)) gone |= ev.type() == mvccpb::Event::DELETE;
        }
      } catch (const Error& e) {
        if (stopping_) return;
        spdlog::warn("rendezvous (etcd): election: {}", e.what());
        waitStopping(kStep);
      }
    }
  }

  enum class DriveEnd { kOver, kWatchLost };

  // A driver whose watch was lost (a compacted revision, or no member for the retry timeout)
  // hands over: it deletes its driver key, so that the next driver (maybe this node again, on
  // its next try) starts from etcd as a takeover does. The key is deleted only while it is
  // still this node's.
  void releaseDriver() {
    const std::string key = rdzv_ + "driver";
    try {
      etcdserverpb::TxnRequest t;
      auto* cmp = t.add_compare();
      cmp->set_key(key);
      cmp->set_target(etcdserverpb::Compare::VALUE);
      cmp->set_result(etcdserverpb::Compare::EQUAL);
      cmp->set_value(o_.nodeId);
      t.add_success()->mutable_request_delete_range()->set_key(key);
      client_.txn(t);
    } catch (const Error& e) {
      spdlog::warn("rendezvous (etcd): cannot hand over driving: {}", e.what());
      waitStopping(kStep);
    }
  }

  // The driver: the one RendezvousState, fed by the keys under rdzv/ and ticked on this process's
  // monotonic clock; every batch of notices goes out in one transaction guarded by the driver key.
  DriveEnd drive() {
    int64_t revision = 0;
    auto all = client_.getPrefix(rdzv_, &revision);
    const std::string nodes = rdzv_ + "nodes/";
    std::set<std::string> keyed;  // nodes whose key exists: alive, as far as etcd knows
    std::optional<pb::RendezvousSnapshot> saved;
    for (const auto& kv : all) {
      if (startsWith(kv.key, nodes)) keyed.insert(kv.key.substr(nodes.size()));
      pb::RendezvousSnapshot snap;
      if (kv.key == rdzv_ + "state" && snap.ParseFromString(kv.value)) saved = snap;
    }
    std::vector<Notice> out;
    std::vector<std::string> applied;
    std::set<std::string> live;
    Micros now = monotonicNow();
    // A driver before us was lost: go on from its last write (every write carried the snapshot,
    // in the same transaction as the notices and the applied events' deletion).
    RendezvousState state = saved ? RendezvousState::restore(fromProto(*saved), now)
                                  : RendezvousState(o_.runId, o_.rules, now);
    if (saved) {
      noticeSeq_ = saved->notice_seq();
      spdlog::info("rendezvous (etcd): this node takes over driving job {} at round {}", o_.runId, saved->round());
      for (const auto& n : saved->nodes()) {
        const std::string& id = n.join().node_id();
        if (keyed.count(id)) {
          live.insert(id);
        } else {
          append(out, state.leave(id, "its etcd lease expired (node gone or stopped)", now));
        }
      }
      if (state.phase() == RendezvousState::Phase::kClosed) {
        write(state, out, applied);
        return DriveEnd::kOver;
      }
    } else {
      spdlog::info("rendezvous (etcd): this node drives the rendezvous of job {}", o_.runId);
    }
    for (const auto& kv : all) apply(state, live, kv.key, &kv.value, out, applied);
    EtcdWatch watch(client_, rdzv_, etcdPrefixEnd(rdzv_), revision);
    while (!stopping_) {
      Micros now = monotonicNow();
      for (const auto& id : live) append(out, state.heartbeat(id, now));  // liveness is etcd's lease
      append(out, state.tick(now));
      if (!out.empty() || !applied.empty()) {
        if (!write(state, out, applied)) return DriveEnd::kOver;  // deposed
        out.clear();
        applied.clear();
      }
      if (state.phase() == RendezvousState::Phase::kClosed) return DriveEnd::kOver;
      auto wait = std::max(heartbeat_ / 8, std::chrono::milliseconds(10));
      auto deadline = SteadyClock::now() + std::min<SteadyClock::duration>(wait, kStep);
      if (auto next = state.nextDeadline()) {
        deadline = std::min(deadline, SteadyClock::time_point(std::chrono::duration_cast<SteadyClock::duration>(*next)));
      }
      std::vector<mvccpb::Event> events;
      try {
        events = watch.next(deadline);
      } catch (const Error& e) {
        spdlog::warn("rendezvous (etcd): driver lost its watch: {}", e.what());
        return DriveEnd::kWatchLost;
      }
      for (const auto& ev : events) {
        const std::string value = ev.kv().value();
        apply(state, live, ev.kv().key(), ev.type() == mvccpb::Event::PUT ? &value : nullptr, out, applied);
      }
    }
    return DriveEnd::kOver;  // this process stops
  }

  static void append(std::vector<Notice>& out, std::vector<Notice> more) {
    for (auto& n : more) out.push_back(std::move(n));
  }

  // One key under rdzv/ (value null: deleted) into the state.
  void apply(RendezvousState& state, std::set<std::string>& live, const std::string& key, const std::string* value,
             std::vector<Notice>& out, std::vector<std::string>& applied) {
    Micros now = monotonicNow();
    const std::string nodes = rdzv_ + "nodes/", events = rdzv_ + "events/";
    if (startsWith(key, nodes)) {
      std::string id = key.substr(nodes.size());
      if (!value) {
        if (live.erase(id)) append(out, state.leave(id, "its etcd lease expired (node gone or stopped)", now));
        return;
      }
      pb::Join j;
      if (live.count(id) || !j.ParseFromString(*value)) return;
      if (RendezvousRules theirs = fromProto(j.rules()); !(theirs == state.rules())) {
        out.push_back({id, Rejection{RejectCode::kRulesMismatch,
                                     "job '" + o_.runId + "' runs with other settings: " +
                                         RendezvousState::rulesDifference(theirs, state.rules()),
                                     true}});
        return;
      }
      NodeInfo info;
      info.nodeId = id;
      info.localWorldSize = j.local_world_size();
      info.host = j.host();
      info.masterPort = j.master_port();
      info.nodeRank = j.node_rank();
      info.reportsStopped = j.reports_stopped();
      live.insert(id);
      append(out, state.join(info, now));
    } else if (startsWith(key, events) && value) {
      std::string rest = key.substr(events.size());
      std::string id = rest.substr(0, rest.find('/'));
      applied.push_back(key);
      pb::AgentMessage msg;
      if (!msg.ParseFromString(*value)) return;
      if (msg.has_worker_failed()) {
        append(out, state.workerFailed(id, msg.worker_failed().round(), now, fromMessage(msg.worker_failed())));
      } else if (msg.has_succeeded()) {
        append(out, state.succeeded(id, msg.succeeded().round(), now));
      } else if (msg.has_workers_stopped()) {
        append(out, state.stopped(id, msg.workers_stopped().round(), now));
        if (!state.hasNode(id)) live.erase(id);  // it had left and waited only for this
      } else if (msg.has_leave() && live.count(id)) {
        // A node whose workers still stop stays in the state (and live) until it reports them
        // stopped or its key goes.
        append(out, state.leave(id, msg.leave().reason(), now, true));
        if (!state.hasNode(id)) live.erase(id);
      }
    }
  }

  // Notices, the applied events' deletion and the state's snapshot, in one transaction that holds only while this
  // node is the driver. False when it no longer is; throws Error when etcd refused or did not answer.
  bool write(const RendezvousState& state, const std::vector<Notice>& notices, const std::vector<std::string>& applied) {
    etcdserverpb::TxnRequest t;
    auto* cmp = t.add_compare();
    cmp->set_key(rdzv_ + "driver");
    cmp->set_target(etcdserverpb::Compare::VALUE);
    cmp->set_result(etcdserverpb::Compare::EQUAL);
    cmp->set_value(o_.nodeId);
    uint64_t latestRound = 0;
    bool jobEnded = false;
    for (const auto& n : notices) {
      auto* put = t.add_success()->mutable_request_put();
      put->set_key(rdzv_ + "notices/" + n.nodeId + "/" + seqKey(++noticeSeq_));
      put->set_value(toProto(o_.runId, n, false).SerializeAsString());
      put->set_lease(jobLease_);
      if (auto* a = std::get_if<RoundAssignment>(&n.body)) latestRound = std::max(latestRound, a->round);
      if (std::holds_alternative<JobEnd>(n.body)) jobEnded = true;
    }
    if (jobEnded && state.round() > 0) {
      // The job is over: the last round's store goes now, so waits still pending fail at once
      // ("stale round") instead of at their timeout.
      auto* del = t.add_success()->mutable_request_delete_range();
      del->set_key(jobPrefix_ + "round/" + std::to_string(state.round()) + "/");
      del->set_range_end(etcdPrefixEnd(del->key()));
    }
    for (const auto& key : applied) t.add_success()->mutable_request_delete_range()->set_key(key);
    auto* st = t.add_success()->mutable_request_put();
    st->set_key(rdzv_ + "state");
    st->set_value(toProto(state.snapshot(monotonicNow()), noticeSeq_).SerializeAsString());
    st->set_lease(jobLease_);
    if (latestRound > 0) {
      // The round marker of the workers' store (worker_sdk/etcd_store.h, fenceByRound): written
      // with the assignment, so it exists before any worker of the round does.
      auto* alive = t.add_success()->mutable_request_put();
      alive->set_key(jobPrefix_ + "round/" + std::to_string(latestRound) + "/alive");
      alive->set_lease(jobLease_);
    }
    if (latestRound > 1) {
      // The workers' keys of the round before (they are fenced by round anyway).
      auto* del = t.add_success()->mutable_request_delete_range();
      del->set_key(jobPrefix_ + "round/" + std::to_string(latestRound - 1) + "/");
      del->set_range_end(etcdPrefixEnd(del->key()));
    }
    // An error (etcd unreachable, a lease gone) is thrown: elect() hands the driver key over and
    // the next driver starts from etcd. Only a failed compare means another node drives now.
    if (client_.txn(t).succeeded()) return true;
    spdlog::warn("rendezvous (etcd): this node no longer drives the rendezvous");
    return false;
  }

  EtcdRendezvousOptions o_;
  Post post_;
  EtcdClient client_;
  std::string jobPrefix_, rdzv_, storeAddr_;
  std::chrono::milliseconds heartbeat_{5000};
  FenceTiming timing_{};
  // When the last renewal that etcd answered was sent (steady clock ticks): read by fenced() on
  // the agent's thread, written by the renewal thread.
  std::atomic<SteadyClock::rep> lastRenewal_{0};

  bool lastRenewalDue(SteadyClock::time_point now) const {
    return now - SteadyClock::time_point(SteadyClock::duration(lastRenewal_.load())) > timing_.agentFence;
  }
  RendezvousListener* listener_ = nullptr;
  int64_t jobLease_ = 0;
  std::atomic<int64_t> nodeLease_{0};  // replaced when the node joins again
  std::atomic<uint64_t> fencedThrough_{0};
  std::atomic<uint64_t> eventSeq_{0};
  uint64_t noticeSeq_ = 0;
  std::atomic<uint64_t> round_{0};
  std::atomic<bool> stopping_{false}, closed_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::unique_ptr<EtcdWatch> notices_;
  std::vector<std::thread> threads_;
};

EtcdRendezvous::EtcdRendezvous(EtcdRendezvousOptions options, Post post)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(post))) {}

EtcdRendezvous::~EtcdRendezvous() = default;

void EtcdRendezvous::join(RendezvousListener* listener) { impl_->join(listener); }

void EtcdRendezvous::reportWorkerFailure(uint64_t round, const WorkerFailure& failure) {
  pb::AgentMessage msg;
  toMessage(failure, msg.mutable_worker_failed());
  msg.mutable_worker_failed()->set_round(round);
  impl_->report(msg);
}

void EtcdRendezvous::reportSucceeded(uint64_t round) {
  pb::AgentMessage msg;
  msg.mutable_succeeded()->set_round(round);
  impl_->report(msg);
}

void EtcdRendezvous::reportStopped(uint64_t round) {
  pb::AgentMessage msg;
  msg.mutable_workers_stopped()->set_round(round);
  impl_->report(msg);
}

void EtcdRendezvous::leave() { impl_->leave(); }

bool EtcdRendezvous::fenced(uint64_t round) const { return impl_->fenced(round); }

}  // namespace ddprun
