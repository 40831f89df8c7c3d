#include "rendezvous/server/daemon_metrics.h"

#include <prometheus/counter.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <deque>
#include <map>
#include <mutex>

#include "metrics/metrics_endpoint.h"
#include "metrics/process_collector.h"
#include "metrics/sample_family.h"

namespace ddprun {
namespace {

using prometheus::MetricType;

double seconds(Micros t) { return std::chrono::duration<double>(t).count(); }

// The gauges and counters read at a scrape.
class GaugeCollector final : public prometheus::Collectable {
 public:
  explicit GaugeCollector(std::function<DaemonGauges()> read) : read_(std::move(read)) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    const DaemonGauges g = read_();
    std::vector<prometheus::MetricFamily> out;
    SampleFamily("ddprun_jobs", "Jobs the rendezvous holds (gathering, running, or over and not forgotten yet).",
                 MetricType::Gauge)
        .add(static_cast<double>(g.jobs))
        .into(&out);
    SampleFamily nodes("ddprun_nodes", "Nodes of a job by state (running, standby, gathering, stopping, leaving).",
                       MetricType::Gauge);
    SampleFamily round("ddprun_job_round", "The job's current (or last) round number.", MetricType::Gauge);
    SampleFamily agents("ddprun_agents_connected", "Agent sessions open to the rendezvous, by job.", MetricType::Gauge);
    for (const auto& job : g.perJob) {
      for (const auto& [state, count] : job.nodesByState) nodes.add(count, {{"run_id", job.runId}, {"state", state}});
      round.add(static_cast<double>(job.round), {{"run_id", job.runId}, {"phase", job.phase}});
      agents.add(job.agents, {{"run_id", job.runId}});
    }
    nodes.into(&out);
    round.into(&out);
    agents.into(&out);
    SampleFamily("ddprun_connections_open", "Connections handed to gRPC and not closed yet.", MetricType::Gauge)
        .add(static_cast<double>(g.connections.open))
        .into(&out);
    SampleFamily("ddprun_connections_accepted_total", "Connections handed to gRPC.", MetricType::Counter)
        .add(static_cast<double>(g.connections.handedOver))
        .into(&out);
    SampleFamily("ddprun_guard_closed_connections_total",
                 "Connections the front door closed, by reason (docs/rendezvous.md, \"Connection guard\").",
                 MetricType::Counter)
        .add(static_cast<double>(g.connections.refusedAtCap), {{"reason", "connection_cap"}})
        .add(static_cast<double>(g.connections.closedSilent), {{"reason", "no_preface"}})
        .add(static_cast<double>(g.connections.closedForAbuse), {{"reason", "call_limits"}})
        .add(static_cast<double>(g.connections.refusedPenalized), {{"reason", "penalized_address"}})
        .add(static_cast<double>(g.connections.relayCutForAbuse), {{"reason", "frame_flood"}})
        .add(static_cast<double>(g.connections.acceptErrors), {{"reason", "accept_error"}})
        .add(static_cast<double>(g.connections.evictedIdle), {{"reason", "idle_at_cap"}})
        .into(&out);
    SampleFamily("ddprun_store_wire_connections_open",
                 "Workers' store connections in the store's own framing (not gRPC), open now.", MetricType::Gauge)
        .add(static_cast<double>(g.storeWire.open))
        .into(&out);
    SampleFamily("ddprun_store_wire_connections_accepted_total",
                 "Workers' store connections in the store's own framing, handed over by the front door.",
                 MetricType::Counter)
        .add(static_cast<double>(g.storeWire.accepted))
        .into(&out);
    SampleFamily("ddprun_store_wire_closed_connections_total",
                 "Store-framing connections closed by the server, by reason: a wrong job token, or bytes no client "
                 "sends (no hello in time, a frame over the limit, unreadable frames), or a partial frame or unread answers that stalled.",
                 MetricType::Counter)
        .add(static_cast<double>(g.storeWire.refusedToken), {{"reason", "wrong_token"}})
        .add(static_cast<double>(g.storeWire.closedBroken), {{"reason", "broken"}})
        .add(static_cast<double>(g.storeWire.closedStalled), {{"reason", "stalled"}})
        .into(&out);
    SampleFamily("ddprun_store_wire_held_bytes",
                 "Bytes the store-framing connections hold together (reserved partial frames, unsent answers).",
                 MetricType::Gauge)
        .add(static_cast<double>(g.storeWire.heldBytes))
        .into(&out);
    SampleFamily("ddprun_store_keys", "Keys in the workers' store, every job together.", MetricType::Gauge)
        .add(static_cast<double>(g.store.keys))
        .into(&out);
    SampleFamily("ddprun_store_bytes", "Bytes (keys and values) in the workers' store.", MetricType::Gauge)
        .add(static_cast<double>(g.store.bytes))
        .into(&out);
    SampleFamily("ddprun_store_pending_waits", "Store waits pending.", MetricType::Gauge)
        .add(static_cast<double>(g.store.waits))
        .into(&out);
    SampleFamily ops("ddprun_store_operations_total", "Store calls, by operation.", MetricType::Counter);
    SampleFamily time("ddprun_store_operation_seconds_total",
                      "Time store calls spent in the store itself (not in gRPC), by operation: divided by "
                      "ddprun_store_operations_total, the store's latency per call.",
                      MetricType::Counter);
    for (std::size_t i = 0; i < g.store.operations.size(); ++i) {
      const std::string op = storeOpName(static_cast<StoreOp>(i));
      ops.add(static_cast<double>(g.store.operations[i]), {{"op", op}});
      time.add(static_cast<double>(g.store.nanos[i]) / 1e9, {{"op", op}});
    }
    ops.into(&out);
    time.into(&out);
    SampleFamily("ddprun_rendezvous_timer_wakeups_total",
                 "Wake-ups of the rendezvous deadline thread (each looks at every job).", MetricType::Counter)
        .add(static_cast<double>(g.timerWakeups))
        .into(&out);
    return out;
  }

 private:
  std::function<DaemonGauges()> read_;
};

// A job's own series, removed when the daemon forgets it.
struct JobSeries {
  std::string label;  // the run id, or "_other"
  prometheus::Counter* rounds = nullptr;
  std::map<std::string, prometheus::Counter*> restarts;  // by cause
  std::map<std::string, prometheus::Counter*> failures;  // by cause
  std::map<std::string, prometheus::Counter*> events;    // by kind
};

}  // namespace

class DaemonMetrics::Impl {
 public:
  Impl(MetricsPortOptions options, std::function<DaemonGauges()> gauges, std::function<bool()> ready)
      : registry_(std::make_shared<prometheus::Registry>()),
        rounds_(prometheus::BuildCounter()
                    .Name("ddprun_rounds_formed_total")
                    .Help("Rounds formed, by job (run_id).")
                    .Register(*registry_)),
        restarts_(prometheus::BuildCounter()
                      .Name("ddprun_restarts_total")
                      .Help("Rounds interrupted, so that every worker restarts, by job and cause (worker_exit, "
                            "signal, hang, node_joined, node_lost, excluded).")
                      .Register(*registry_)),
        failures_(prometheus::BuildCounter()
                      .Name("ddprun_failures_total")
                      .Help("Failures by job and cause: a worker's (worker_exit, signal, hang), a node lost, a "
                            "report fenced for a stale round, a node excluded.")
                      .Register(*registry_)),
        events_(prometheus::BuildCounter()
                    .Name("ddprun_job_events_total")
                    .Help("Job events (README \"Job timeline\"), by job and kind.")
                    .Register(*registry_)),
        formation_(prometheus::BuildHistogram()
                       .Name("ddprun_round_formation_seconds")
                       .Help("From the start of a gathering (the job's start, or the interruption of its round) "
                             "to the round formed.")
                       .Register(*registry_)
                       .Add({}, prometheus::Histogram::BucketBoundaries{0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1,
                                                                        2.5, 5, 10, 30, 60, 300})),
        heartbeatLag_(prometheus::BuildHistogram()
                          .Name("ddprun_heartbeat_lag_seconds")
                          .Help("Time between a node's heartbeat and its previous message, as the server saw it.")
                          .Register(*registry_)
                          .Add({}, prometheus::Histogram::BucketBoundaries{0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 30})),
        gauges_(std::make_shared<GaugeCollector>([this, read = std::move(gauges)] {
          prune();
          return read();
        })),
        process_(std::make_shared<ProcessCollector>()) {
    MetricsEndpoint::Options o;
    o.bindAddress = options.bindAddress;
    o.port = options.port;
    // An idle connection holds one of maxConnections until its request came in, for at most the
    // request timeout (loopback by default).
    o.requestTimeout = std::chrono::milliseconds(2000);
    endpoint_ = std::make_unique<MetricsEndpoint>(
        o, std::vector<std::weak_ptr<prometheus::Collectable>>{registry_, gauges_, process_}, std::move(ready));
  }

  std::string address() const { return endpoint_->address(); }

  void onEvents(const std::string& runId, const std::vector<JobEvent>& events) {
    using K = JobEvent::Kind;
    std::lock_guard<std::mutex> lock(mu_);
    pruneLocked();
    // A new run of a run id whose series wait for removal keeps them: it is the same job label.
    for (auto it = gone_.begin(); it != gone_.end();) it = it->second == runId ? gone_.erase(it) : std::next(it);
    JobSeries& s = seriesOf(runId);
    for (const auto& e : events) {
      counter(events_, s.events, s.label, "kind", eventKindName(e.kind)).Increment();
      switch (e.kind) {
        case K::kRoundFormed:
          s.rounds->Increment();
          formation_.Observe(seconds(e.took));
          break;
        case K::kRoundInterrupted: counter(restarts_, s.restarts, s.label, "cause", eventCauseName(e.cause)).Increment(); break;
        case K::kWorkerFailed: counter(failures_, s.failures, s.label, "cause", eventCauseName(e.cause)).Increment(); break;
        case K::kNodeLost: counter(failures_, s.failures, s.label, "cause", "node_lost").Increment(); break;
        case K::kNodeFenced: counter(failures_, s.failures, s.label, "cause", "fenced").Increment(); break;
        case K::kNodeExcluded: counter(failures_, s.failures, s.label, "cause", "excluded").Increment(); break;
        case K::kNodeJoined:
        case K::kJobEnded: break;
      }
    }
  }

  void onHeartbeatGap(Micros gap) { heartbeatLag_.Observe(seconds(gap)); }

  // The series stay kSeriesRetention longer, so that a job shorter than a scrape interval is seen
  // at least once; then they go (removed at the next event or scrape after that).
  void onJobGone(const std::string& runId) {
    std::lock_guard<std::mutex> lock(mu_);
    if (jobs_.count(runId)) gone_.emplace_back(std::chrono::steady_clock::now() + kSeriesRetention, runId);
    pruneLocked();
  }

  void prune() {
    std::lock_guard<std::mutex> lock(mu_);
    pruneLocked();
  }

 private:
  static constexpr std::chrono::minutes kSeriesRetention{2};

  void pruneLocked() {
    const auto now = std::chrono::steady_clock::now();
    while (!gone_.empty() && gone_.front().first <= now) {
      removeLocked(gone_.front().second);
      gone_.pop_front();
    }
  }

  void removeLocked(const std::string& runId) {
    auto it = jobs_.find(runId);
    if (it == jobs_.end()) return;
    rounds_.Remove(it->second.rounds);
    for (auto& [cause, c] : it->second.restarts) restarts_.Remove(c);
    for (auto& [cause, c] : it->second.failures) failures_.Remove(c);
    for (auto& [kind, c] : it->second.events) events_.Remove(c);
    jobs_.erase(it);
  }

  // Under mu_. Past kMaxJobSeries jobs, a new job's events go to "_other" (never removed).
  JobSeries& seriesOf(const std::string& runId) {
    const std::string& label = jobs_.count(runId) || jobs_.size() < kMaxJobSeries ? runId : kOther;
    auto [it, added] = jobs_.try_emplace(label);
    if (added) {
      // Every series of the job from 0, so that rate() and increase() see its first event.
      JobSeries& s = it->second;
      s.label = label;
      s.rounds = &rounds_.Add({{"run_id", label}});
      for (const char* cause : {"worker_exit", "signal", "hang", "node_joined", "node_lost", "excluded"}) {
        counter(restarts_, s.restarts, label, "cause", cause);
      }
      for (const char* cause : {"worker_exit", "signal", "hang", "node_lost", "fenced", "excluded"}) {
        counter(failures_, s.failures, label, "cause", cause);
      }
      for (int k = 0; k <= static_cast<int>(JobEvent::Kind::kJobEnded); ++k) {
        counter(events_, s.events, label, "kind", eventKindName(static_cast<JobEvent::Kind>(k)));
      }
    }
    return it->second;
  }
  prometheus::Counter& counter(prometheus::Family<prometheus::Counter>& family,
                               std::map<std::string, prometheus::Counter*>& known, const std::string& job,
                               const char* labelName, const std::string& value) {
    auto it = known.find(value);
    if (it != known.end()) return *it->second;
    prometheus::Counter& c = family.Add({{"run_id", job}, {labelName, value}});
    known.emplace(value, &c);
    return c;
  }

  static constexpr const char* kOther = "_other";
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& rounds_;
  prometheus::Family<prometheus::Counter>& restarts_;
  prometheus::Family<prometheus::Counter>& failures_;
  prometheus::Family<prometheus::Counter>& events_;
  prometheus::Histogram& formation_;
  prometheus::Histogram& heartbeatLag_;
  std::shared_ptr<GaugeCollector> gauges_;
  std::shared_ptr<ProcessCollector> process_;
  std::mutex mu_;
  std::map<std::string, JobSeries> jobs_;  // by run id (or kOther)
  std::deque<std::pair<std::chrono::steady_clock::time_point, std::string>> gone_;  // removal due, run id
  std::unique_ptr<MetricsEndpoint> endpoint_;  // last: stops serving before the rest goes
};

DaemonMetrics::DaemonMetrics(MetricsPortOptions options, std::function<DaemonGauges()> gauges,
                             std::function<bool()> ready)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(gauges), std::move(ready))) {}
DaemonMetrics::~DaemonMetrics() = default;
std::string DaemonMetrics::address() const { return impl_->address(); }
void DaemonMetrics::onEvents(const std::string& runId, const std::vector<JobEvent>& events) {
  impl_->onEvents(runId, events);
}
void DaemonMetrics::onHeartbeatGap(Micros gap) { impl_->onHeartbeatGap(gap); }
void DaemonMetrics::onJobGone(const std::string& runId) { impl_->onJobGone(runId); }

}  // namespace ddprun
