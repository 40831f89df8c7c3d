// The job's events as the rules host derives them (rendezvous/rules/job_event.h): what the
// metrics, the status call and the timelines read, so each kind is checked with its fields.
#include "rendezvous/rules/rules_host.h"

#include "rendezvous/wire/status_proto.h"
#include "state_machine_test_util.h"

namespace {

using namespace ddprun::state_machine_test;
using ddprun::AgentReport;
using ddprun::Admitted;
using ddprun::EventCause;
using ddprun::JobEvent;
using ddprun::RulesHost;
using ddprun::WorkerFailure;

// "seq kind node round cause", one per event.
Lines render(const std::vector<JobEvent>& events) {
  Lines out;
  for (const auto& e : events) {
    std::string line = std::to_string(e.seq) + " " + ddprun::eventKindName(e.kind);
    if (!e.node.empty()) line += " " + e.node;
    if (e.round) line += " r" + std::to_string(e.round);
    if (e.cause != EventCause::kNone) line += " " + std::string(ddprun::eventCauseName(e.cause));
    out.push_back(line);
  }
  return out;
}

WorkerFailure failure(int rank, int exitCode, int signal, int exitStatus) {
  WorkerFailure f;
  f.rank = rank;
  f.exitCode = exitCode;
  f.signal = signal;
  f.exitStatus = exitStatus;
  f.description = "failed";
  return f;
}

RendezvousRules elastic(int min, int max, int restarts) {
  RendezvousRules r = rules(min, max);
  r.maxRestarts = restarts;
  return r;
}

}  // namespace

TEST_CASE("job events: joins, a round, a worker failure, a restart and the end, numbered in order",
          "[rendezvous][events]") {
  const auto r = elastic(2, 2, 1);
  RulesHost host("job", r, sec(0));
  CHECK(render(host.join(Admitted{nodeInfo("a"), r, ""}, sec(1)).events) == Lines{"1 node_joined a"});
  auto fx = host.join(Admitted{nodeInfo("b"), r, ""}, sec(3));
  CHECK(render(fx.events) == Lines{"2 node_joined b", "3 round_formed r1"});
  const JobEvent& formed = fx.events.back();
  CHECK(formed.members == Lines{"a", "b"});
  CHECK(formed.took == sec(3));  // since the job's gathering began
  CHECK(formed.at == sec(3));

  fx = host.report("b", AgentReport::workerFailed(1, failure(1, 7, 0, 7)), sec(5));
  // Agents that do not report their workers stopped (an older ddprun) are not waited for: the
  // next round forms at once.
  CHECK(render(fx.events) ==
        Lines{"4 worker_failed b r1 worker_exit", "5 round_interrupted r1 worker_exit", "6 round_formed r2"});
  CHECK(fx.events[0].failure->exitCode == 7);
  CHECK(fx.events[1].restartSpent);
  CHECK(fx.events[1].restartCount == 1);
  CHECK(fx.events[2].took == Micros(0));
  REQUIRE(host.lastFailure());
  CHECK(host.lastFailure()->seq == 4);

  // A failure of round 2 ends the job: the budget is spent. The end carries the failure and its
  // exit status.
  fx = host.report("a", AgentReport::workerFailed(2, failure(0, -1, 9, 137)), sec(7));
  CHECK(render(fx.events) == Lines{"7 worker_failed a r2 signal", "8 job_ended a r2"});
  CHECK_FALSE(fx.events[1].succeeded);
  CHECK(fx.events[1].exitStatus == 137);
  CHECK(host.lastSeq() == 8);
}

TEST_CASE("job events: the hand-over counts in the round's formation time", "[rendezvous][events]") {
  const auto r = elastic(2, 2, 1);
  RulesHost host("job", r, sec(0));
  auto handing = [](const std::string& id) {
    auto n = nodeInfo(id);
    n.reportsStopped = true;
    return n;
  };
  host.join(Admitted{handing("a"), r, ""}, sec(0));
  host.join(Admitted{handing("b"), r, ""}, sec(0));
  auto fx = host.report("b", AgentReport::workerFailed(1, failure(1, 7, 0, 7)), sec(5));
  CHECK(render(fx.events) == Lines{"4 worker_failed b r1 worker_exit", "5 round_interrupted r1 worker_exit"});
  CHECK(host.report("a", AgentReport::workersStopped(1), sec(5)).events.empty());
  fx = host.report("b", AgentReport::workersStopped(1), sec(6));
  CHECK(render(fx.events) == Lines{"6 round_formed r2"});
  CHECK(fx.events[0].took == sec(1));
}

TEST_CASE("job events: a hang, a lost node, a fenced report, a success", "[rendezvous][events]") {
  const auto r = elastic(1, 2, 3);
  RulesHost host("job", r, sec(0));
  host.join(Admitted{nodeInfo("a"), r, ""}, sec(0));
  host.join(Admitted{nodeInfo("b"), r, ""}, sec(0));  // events 1-3: max nodes, the round forms
  // Hung: the agent stopped the rank and reports 124; a worker exiting 124 itself is an exit code.
  CHECK(ddprun::causeOf(failure(0, -1, 15, 124)) == EventCause::kHang);
  CHECK(ddprun::causeOf(failure(0, 124, 0, 124)) == EventCause::kWorkerExit);

  // b is silent past the heartbeat timeout: lost, and the round stops for it (no restart spent).
  host.report("a", AgentReport::heartbeat(1), sec(4));
  auto fx = host.tick(sec(6));
  CHECK(render(fx.events) == Lines{"4 node_lost b", "5 round_interrupted r1 node_lost", "6 round_formed r2"});
  CHECK_FALSE(fx.events[1].restartSpent);
  CHECK_THAT(fx.events[0].reason, Contains("no heartbeat"));

  // A report for the round that stopped is refused: fenced, naming that round.
  fx = host.report("a", AgentReport::succeeded(1), sec(6));
  CHECK(render(fx.events) == Lines{"7 node_fenced a r1"});

  // The heartbeat gap (since the node's last accepted message) feeds the lag histogram; a heartbeat makes
  // no event.
  fx = host.report("a", AgentReport::heartbeat(2), sec(9));
  CHECK(fx.events.empty());
  REQUIRE(fx.heartbeatGap);
  CHECK(*fx.heartbeatGap == sec(5));  // since its heartbeat at 4 s: a refused report is not heard

  fx = host.report("a", AgentReport::succeeded(2), sec(10));
  CHECK(render(fx.events) == Lines{"8 job_ended r2"});
  CHECK(fx.events[0].succeeded);
  CHECK(fx.events[0].exitStatus == 0);
}

TEST_CASE("job events: a node that says it leaves is lost once, a joiner interrupts, an excluded host",
          "[rendezvous][events]") {
  auto r = elastic(1, 3, 5);
  r.excludeNodeAfter = 1;
  r.heartbeatTimeout = sec(100);
  RulesHost host("job", r, sec(0));
  host.join(Admitted{nodeInfo("a"), r, ""}, sec(0));
  host.join(Admitted{nodeInfo("b"), r, ""}, sec(0));
  auto fx = host.tick(sec(30));  // the last call
  CHECK(render(fx.events) == Lines{"3 round_formed r1"});

  fx = host.join(Admitted{nodeInfo("c"), r, ""}, sec(31));
  CHECK(render(fx.events) == Lines{"4 node_joined c", "5 round_interrupted r1 node_joined", "6 round_formed r2"});

  fx = host.report("c", AgentReport::leave("SIGTERM"), sec(32));
  CHECK(render(fx.events) ==
        Lines{"7 node_lost c", "8 round_interrupted r2 node_lost", "9 round_formed r3"});
  // Its stream ends afterwards: it is gone already, no second event.
  CHECK(host.leave("c", "stream ended", sec(33)).events.empty());

  // A worker failure with --exclude_node_after=1 excludes its node's host: the round stops for
  // the exclusion, not as a restart.
  fx = host.report("b", AgentReport::workerFailed(3, failure(1, 3, 0, 3)), sec(34));
  CHECK(render(fx.events) == Lines{"10 worker_failed b r3 worker_exit", "11 node_excluded b",
                                   "12 round_interrupted r3 excluded", "13 round_formed r4"});
  CHECK_FALSE(fx.events[2].restartSpent);
  // The host is refused for good; the refusal is an event too.
  fx = host.join(Admitted{nodeInfo("b"), r, ""}, sec(35));
  CHECK(render(fx.events) == Lines{"14 node_excluded b"});
}

// Prometheus showed it (test_observability): after a job succeeded, its agents' streams end, and
// each counted as a node lost, a failure. Once the job is over, a node going is no event.
TEST_CASE("job events: nodes that go after the job ended are not lost", "[rendezvous][events]") {
  const auto r = elastic(2, 2, 0);
  RulesHost host("job", r, sec(0));
  host.join(Admitted{nodeInfo("a"), r, ""}, sec(0));
  host.join(Admitted{nodeInfo("b"), r, ""}, sec(0));
  host.report("a", AgentReport::succeeded(1), sec(1));
  auto fx = host.report("b", AgentReport::succeeded(1), sec(1));
  CHECK(render(fx.events) == Lines{"4 job_ended r1"});
  CHECK(host.leave("a", "stream ended", sec(2)).events.empty());
  CHECK(host.report("b", AgentReport::leave("done"), sec(2)).events.empty());
  CHECK_FALSE(host.lastFailure());
}

// The etcd driver's takeover (docs/etcd.md): the successor numbers events on from the snapshot's
// and keeps the job's newest failure, which the snapshot carries as a JobEventSummary.
TEST_CASE("job events: a successor from a snapshot numbers on and keeps the last failure", "[rendezvous][events]") {
  const auto r = elastic(2, 2, 3);
  RulesHost host("job", r, sec(0));
  host.join(Admitted{nodeInfo("a"), r, ""}, sec(0));
  host.join(Admitted{nodeInfo("b"), r, ""}, sec(0));
  host.report("b", AgentReport::workerFailed(1, failure(1, 7, 0, 7)), sec(1));
  REQUIRE(host.lastFailure());
  ddprun::v1::JobEventSummary summary;
  ddprun::toProto(*host.lastFailure(), std::nullopt, &summary);
  CHECK(summary.message() == "rank 1 failed");
  CHECK(summary.age_s() == -1);  // another host's clock: no age

  RulesHost successor(host.state().snapshot(sec(2)), sec(100), host.lastSeq(), ddprun::fromProto(summary));
  REQUIRE(successor.lastFailure());
  CHECK(successor.lastFailure()->seq == host.lastFailure()->seq);
  CHECK(successor.lastFailure()->kind == JobEvent::Kind::kWorkerFailed);
  CHECK(successor.lastFailure()->cause == EventCause::kWorkerExit);
  CHECK(successor.lastFailure()->failure->exitCode == 7);
  CHECK(successor.lastFailure()->failure->description == "failed");  // not "rank 1 rank 1 failed"
  auto fx = successor.report("a", AgentReport::workerFailed(2, failure(0, 4, 0, 4)), sec(101));
  REQUIRE_FALSE(fx.events.empty());
  CHECK(fx.events.front().seq == host.lastSeq() + 1);
}
