#include "agent/agent_metrics.h"

#include <prometheus/collectable.h>

#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <vector>

#include "metrics/metrics_endpoint.h"
#include "metrics/process_collector.h"
#include "metrics/sample_family.h"

namespace ddprun {
namespace {

using prometheus::MetricType;
using Clock = std::chrono::steady_clock;

enum class WorkerState { kNone, kRunning, kSucceeded, kFailed, kStopped };
constexpr std::array<const char*, 4> kStateNames{"running", "succeeded", "failed", "stopped"};

// Everything the agent's events say, read at a scrape; one lock, taken by the agent's event loop
// (a few counters per event) and by the scrape.
class AgentState final : public prometheus::Collectable {
 public:
  explicit AgentState(int localWorldSize)
      : workers_(static_cast<std::size_t>(std::max(localWorldSize, 0)), WorkerState::kNone),
        ranks_(static_cast<std::size_t>(std::clamp(localWorldSize, 0, AgentMetrics::kMaxRankSeries))) {}

  void onEvent(const AgentEvent& e) {
    using K = AgentEvent::Kind;
    std::lock_guard<std::mutex> lock(mu_);
    auto worker = [&](WorkerState s) {
      if (e.localRank >= 0 && static_cast<std::size_t>(e.localRank) < workers_.size()) workers_[e.localRank] = s;
    };
    switch (e.kind) {
      case K::kRoundFormed:
        if (roundsFormed_++ > 0) ++restarts_;
        round_ = e.round;
        for (auto& w : workers_) w = w == WorkerState::kRunning ? WorkerState::kStopped : w;
        break;
      case K::kWorkerStarted: worker(WorkerState::kRunning); break;
      case K::kWorkerSucceeded: worker(WorkerState::kSucceeded); break;
      case K::kWorkerFailed:
        worker(WorkerState::kFailed);
        ++failures_[e.cause];
        break;
      case K::kRoundInterrupted:
      case K::kFenced:
      case K::kJobEnded:
        for (auto& w : workers_) w = w == WorkerState::kRunning ? WorkerState::kStopped : w;
        running_ = false;
        break;
      case K::kHang: ++hangs_; break;
      case K::kStraggler:
        if (!e.back) ++stragglers_;
        break;
      case K::kJoining: break;
    }
    if (e.kind == K::kWorkerStarted) running_ = true;
  }

  void onStep(int localRank, double seconds) {
    if (localRank < 0 || static_cast<std::size_t>(localRank) >= ranks_.size()) return;
    std::lock_guard<std::mutex> lock(mu_);
    ranks_[localRank] = {seconds, Clock::now(), true};
  }

  bool running() const {
    std::lock_guard<std::mutex> lock(mu_);
    return running_;
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<prometheus::MetricFamily> out;
    std::array<int, kStateNames.size()> counts{};
    for (WorkerState w : workers_) {
      if (w != WorkerState::kNone) ++counts[static_cast<std::size_t>(w) - 1];
    }
    SampleFamily workers("ddprun_agent_workers", "This node's workers by state (of the latest round).",
                         MetricType::Gauge);
    for (std::size_t i = 0; i < kStateNames.size(); ++i) workers.add(counts[i], {{"state", kStateNames[i]}});
    workers.into(&out);
    SampleFamily("ddprun_agent_round", "The round this node runs in (0 before the first).", MetricType::Gauge)
        .add(static_cast<double>(round_))
        .into(&out);
    SampleFamily("ddprun_agent_restarts_total", "Times this node's workers started again in a new round.",
                 MetricType::Counter)
        .add(restarts_)
        .into(&out);
    SampleFamily failures("ddprun_agent_worker_failures_total",
                          "This node's worker failures (the first of each round), by cause: worker_exit, signal, "
                          "hang.",
                          MetricType::Counter);
    for (const char* cause : {"worker_exit", "signal", "hang"}) {
      auto it = failures_.find(cause);
      failures.add(it == failures_.end() ? 0 : it->second, {{"cause", cause}});
    }
    failures.into(&out);
    SampleFamily("ddprun_agent_hangs_total", "Ranks this node found hung (--hang_timeout, --finish_timeout).",
                 MetricType::Counter)
        .add(hangs_)
        .into(&out);
    SampleFamily("ddprun_agent_stragglers_total", "Times a rank was named a straggler (on this node or across the job).",
                 MetricType::Counter)
        .add(stragglers_)
        .into(&out);
    SampleFamily step("ddprun_agent_step_seconds", "A local rank's own work in its last reported step.",
                      MetricType::Gauge);
    SampleFamily age("ddprun_agent_heartbeat_age_seconds", "Time since a local rank last reported a step.",
                     MetricType::Gauge);
    const auto now = Clock::now();
    for (std::size_t i = 0; i < ranks_.size(); ++i) {
      if (!ranks_[i].seen) continue;
      step.add(ranks_[i].seconds, {{"local_rank", std::to_string(i)}});
      age.add(std::chrono::duration<double>(now - ranks_[i].at).count(), {{"local_rank", std::to_string(i)}});
    }
    step.into(&out);
    age.into(&out);
    return out;
  }

 private:
  struct RankStep {
    double seconds = 0;
    Clock::time_point at;
    bool seen = false;
  };
  mutable std::mutex mu_;
  std::vector<WorkerState> workers_;
  std::vector<RankStep> ranks_;
  uint64_t round_ = 0;
  int roundsFormed_ = 0;
  double restarts_ = 0;
  std::map<std::string, double> failures_;
  double hangs_ = 0;
  double stragglers_ = 0;
  bool running_ = false;
};

}  // namespace

class AgentMetrics::Impl {
 public:
  Impl(MetricsPortOptions options, int localWorldSize)
      : state_(std::make_shared<AgentState>(localWorldSize)), process_(std::make_shared<ProcessCollector>()) {
    MetricsEndpoint::Options o;
    o.bindAddress = options.bindAddress;
    o.port = options.port;
    o.requestTimeout = std::chrono::milliseconds(2000);
    endpoint_ = std::make_unique<MetricsEndpoint>(o, std::vector<std::weak_ptr<prometheus::Collectable>>{state_, process_},
                                                  [state = state_] { return state->running(); });
  }
  std::shared_ptr<AgentState> state_;
  std::shared_ptr<ProcessCollector> process_;
  std::unique_ptr<MetricsEndpoint> endpoint_;  // last: stops serving first
};

AgentMetrics::AgentMetrics(MetricsPortOptions options, int localWorldSize)
    : impl_(std::make_unique<Impl>(std::move(options), localWorldSize)) {}
AgentMetrics::~AgentMetrics() = default;
std::string AgentMetrics::address() const { return impl_->endpoint_->address(); }
void AgentMetrics::onEvent(const AgentEvent& event) { impl_->state_->onEvent(event); }
void AgentMetrics::onStep(int localRank, double seconds) { impl_->state_->onStep(localRank, seconds); }

}  // namespace ddprun
