#include "rendezvous/etcd/etcd_driver.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <set>

#include "common/error.h"
#include "common/ids.h"
#include "ddprun/v1/etcd_rendezvous.pb.h"
#include "ddprun/v1/rendezvous.pb.h"
#include "rendezvous/rules/admission.h"
#include "rendezvous/etcd/etcd_records.h"
#include "rendezvous/wire/agent_proto.h"
#include "rendezvous/wire/notice_proto.h"
#include "rendezvous/wire/status_proto.h"

namespace ddprun {

namespace pb = ddprun::v1;
using namespace etcd_records;  // NOLINT: the records of this backend, both ways
using SteadyClock = std::chrono::steady_clock;

namespace {

Micros monotonicNow() { return std::chrono::duration_cast<Micros>(SteadyClock::now().time_since_epoch()); }

}  // namespace

std::optional<int64_t> waitWatchStarted(EtcdWatch& watch, const std::atomic<bool>& stopping) {
  while (!stopping) {
    if (auto from = watch.startedAfter(SteadyClock::now() + std::chrono::milliseconds(50))) return from;
  }
  return std::nullopt;
}

EtcdDriver::EtcdDriver(EtcdClient& client, EtcdDriverOptions options, const std::atomic<bool>& stopping)
    : client_(client), options_(std::move(options)), stopping_(stopping), keys_(options_.root, options_.runId) {}

// The driver: the one RendezvousState, fed by the keys under rdzv/ and ticked on this process's
// monotonic clock; every batch of notices goes out in one transaction guarded by the driver key.
EtcdDriver::End EtcdDriver::drive() {
  // The watch first, from now, then everything under rdzv/ as of the revision it starts after:
  // nothing is missed or seen twice, and the watch gets each join as it commits (EtcdWatch).
  EtcdWatch watch(client_, keys_.rdzv(), etcdPrefixEnd(keys_.rdzv()), EtcdWatch::kFromNow);
  std::optional<int64_t> from;
  try {
    from = waitWatchStarted(watch, stopping_);
  } catch (const Error& e) {
    spdlog::warn("rendezvous (etcd): driver lost its watch: {}", e.what());
    return End::kWatchLost;
  }
  if (!from) return End::kOver;  // this process stops
  auto all = client_.getPrefix(keys_.rdzv(), nullptr, *from);
  std::set<std::string> keyed;  // nodes whose key exists: alive, as far as etcd knows
  std::optional<pb::RendezvousSnapshot> saved;
  const std::string stateKey = keys_.state();
  for (const auto& kv : all) {
    if (auto id = keys_.nodeOfNodeKey(kv.key)) keyed.insert(*id);
    pb::RendezvousSnapshot snap;
    if (kv.key == stateKey && snap.ParseFromString(kv.value)) saved = snap;
  }
  Effects out;
  std::vector<std::string> applied;
  std::set<std::string> live;
  Micros now = monotonicNow();
  // A driver before us was lost: go on from its last write (every write carried the snapshot,
  // in the same transaction as the notices and the applied events' deletion).
  RulesHost host = saved ? RulesHost(fromProto(*saved), now, saved->last_event_seq(),
                                     saved->has_last_failure() ? std::optional<JobEvent>(fromProto(saved->last_failure()))
                                                               : std::nullopt)
                         : RulesHost(options_.runId, options_.rules, now);
  if (saved) {
    noticeSeq_ = saved->notice_seq();
    spdlog::info("rendezvous (etcd): this node takes over driving job {} at round {}", options_.runId, saved->round());
    for (const auto& n : saved->nodes()) {
      const std::string& id = n.join().node_id();
      if (keyed.count(id)) {
        live.insert(id);
      } else {
        out.append(host.leave(id, "its etcd lease expired (node gone or stopped)", now));
      }
    }
    if (host.state().phase() == RendezvousState::Phase::kClosed) {
      write(host, out, applied);
      return End::kOver;
    }
  } else {
    spdlog::info("rendezvous (etcd): this node drives the rendezvous of job {}", options_.runId);
  }
  for (const auto& kv : all) apply(host, live, kv.key, &kv.value, out, applied);
  // A batch that changed only the state (joins of a round still gathering: events, no notice)
  // is written within kSnapshotDelay, or with the next batch that must go out, not on its own:
  // each write is a raft commit that the driver waits for before it reads the next joins, and
  // a job starting on N nodes made up to N - 1 of them in a row before the round's. A successor
  // that takes over meanwhile loses nothing: it rebuilds the joins from the node keys.
  auto deferredUntil = SteadyClock::time_point::max();
  while (!stopping_) {
    Micros now = monotonicNow();
    for (const auto& id : live) {
      out.append(host.report(id, AgentReport::heartbeat(0), now));  // liveness is etcd's lease
    }
    out.append(host.tick(now));
    const bool mustGo = !out.notices.empty() || !out.roundsStarted.empty() || out.jobEnded || !applied.empty();
    if (mustGo || (!out.empty() && SteadyClock::now() >= deferredUntil)) {
      if (!write(host, out, applied)) return End::kOver;  // deposed
      out = Effects();
      applied.clear();
      deferredUntil = SteadyClock::time_point::max();
    } else if (!out.empty() && deferredUntil == SteadyClock::time_point::max()) {
      deferredUntil = SteadyClock::now() + kSnapshotDelay;
    }
    if (host.state().phase() == RendezvousState::Phase::kClosed) return End::kOver;
    auto wait = std::max(options_.heartbeat / 8, std::chrono::milliseconds(10));
    auto deadline = std::min(SteadyClock::now() + std::min<SteadyClock::duration>(wait, kStep), deferredUntil);
    if (auto next = host.state().nextDeadline()) {
      deadline = std::min(deadline, SteadyClock::time_point(std::chrono::duration_cast<SteadyClock::duration>(*next)));
    }
    std::vector<mvccpb::Event> events;
    try {
      events = watch.next(deadline);
    } catch (const Error& e) {
      spdlog::warn("rendezvous (etcd): driver lost its watch: {}", e.what());
      return End::kWatchLost;
    }
    for (const auto& ev : events) {
      const std::string value = ev.kv().value();
      apply(host, live, ev.kv().key(), ev.type() == mvccpb::Event::PUT ? &value : nullptr, out, applied);
    }
  }
  return End::kOver;  // this process stops
}

// One key under rdzv/ (value null: deleted) into the rules host.
void EtcdDriver::apply(RulesHost& host, std::set<std::string>& live, const std::string& key, const std::string* value,
           Effects& out, std::vector<std::string>& applied) {
  Micros now = monotonicNow();
  if (auto nodeKey = keys_.nodeOfNodeKey(key)) {
    const std::string& id = *nodeKey;
    if (!value) {
      if (live.erase(id)) out.append(host.leave(id, "its etcd lease expired (node gone or stopped)", now));
      return;
    }
    pb::Join j;
    if (live.count(id)) return;
    if (!j.ParseFromString(*value)) j.Clear();  // refused below as a Join without ids
    // etcd shows no peer address: the Join must name its host, and its node id must be the
    // key's (the notices go to the key's name, which is what the node watches).
    JoinOrigin origin;
    origin.keyNodeId = id;
    origin.runId = options_.runId;
    auto admission = admit(joinRequestOf(j), origin);
    if (auto* refused = std::get_if<Rejection>(&admission)) {
      if (idProblem(id)) {
        // No node can watch a name like "x/evil" (it would land under node x's notices): no
        // refusal is written, and the key stays until its lease goes.
        spdlog::warn("rendezvous (etcd): ignored a node key with an invalid name: {}", refused->message);
        return;
      }
      spdlog::warn("rendezvous (etcd): refused node {}: {}", id, refused->message);
      Effects refusal;
      refusal.notices.push_back(Notice{id, *refused});
      out.append(std::move(refusal));
      return;
    }
    out.append(host.join(std::get<Admitted>(admission), now));
    // A node the rules refused (a taken id or rank, a stale round) is not heartbeaten into
    // NOT_JOINED refusals on every pass: it is live only once it is in the job.
    if (host.state().hasNode(id)) live.insert(id);
  } else if (auto eventKey = keys_.nodeOfEventKey(key); eventKey && value) {
    const std::string& id = *eventKey;
    applied.push_back(key);
    pb::AgentMessage msg;
    if (!msg.ParseFromString(*value)) return;
    auto report = reportOf(msg);
    if (!report) return;
    // Liveness is the lease: a heartbeat event only carries the node's health.
    if (report->kind == AgentReport::Kind::kHeartbeat && (!report->health || !live.count(id))) return;
    if (report->kind == AgentReport::Kind::kLeave && !live.count(id)) return;
    out.append(host.report(id, *report, now));
    // A node that left and whose workers are gone is out; one whose workers still stop stays in
    // the state (and live) until it reports them stopped or its key goes.
    if (!host.state().hasNode(id)) live.erase(id);
  }
}

// Notices, the applied events' deletion, the state's snapshot and the store's drops, in one
// transaction that holds only while this node is the driver. False when it no longer is; throws Error when etcd refused or did not answer.
bool EtcdDriver::write(const RulesHost& host, const Effects& effects, const std::vector<std::string>& applied) {
  const RendezvousState& state = host.state();
  const uint64_t eventSeq = host.lastSeq();  // a successor numbers on from it (the snapshot)
  etcdserverpb::TxnRequest t = whileDriver(keys_, options_.nodeId);
  for (const auto& n : effects.notices) {
    auto* put = t.add_success()->mutable_request_put();
    put->set_key(keys_.notice(n.nodeId, ++noticeSeq_));
    put->set_value(toProto(options_.runId, n, Liveness::kLease, state, eventSeq).SerializeAsString());
    put->set_lease(options_.jobLease);
  }
  for (const auto& key : applied) t.add_success()->mutable_request_delete_range()->set_key(key);
  auto* st = t.add_success()->mutable_request_put();
  st->set_key(keys_.state());
  pb::RendezvousSnapshot snapshot = toProto(state.snapshot(monotonicNow()), noticeSeq_);
  snapshot.set_last_event_seq(eventSeq);
  if (host.lastFailure()) toProto(*host.lastFailure(), std::nullopt, snapshot.mutable_last_failure());
  st->set_value(snapshot.SerializeAsString());
  st->set_lease(options_.jobLease);
  // The workers' store, as the rules host decided (StoreDrops): its waits still pending fail at
  // once ("stale round") instead of at their timeout.
  const StoreDrops& drops = effects.storeDrops;
  if (drops.run) {
    dropAllRounds(keys_, &t);
  } else if (drops.roundsBelow > 0) {
    dropRoundsBelow(keys_, drops.roundsBelow, &t);
    // The round marker of the workers' store (store/etcd/etcd_key_store.h, fenceByRound): written
    // with the assignment, so it exists before any worker of the round does.
    auto* alive = t.add_success()->mutable_request_put();
    alive->set_key(keys_.roundMarker(drops.roundsBelow));
    alive->set_lease(options_.jobLease);
  }
  // An error (etcd unreachable, a lease gone) is thrown: elect() hands the driver key over and
  // the next driver starts from etcd. Only a failed compare means another node drives now.
  if (client_.txn(t).succeeded()) return true;
  spdlog::warn("rendezvous (etcd): this node no longer drives the rendezvous");
  return false;
}

}  // namespace ddprun
