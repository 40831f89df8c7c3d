// rendezvous/rules/job_health.h: the job-wide health view from the members' reports.
#include "rendezvous/rules/job_health.h"

#include <catch2/catch.hpp>

#include "rendezvous/rules/rules_host.h"
#include "state_machine_test_util.h"

using ddprun::JobHealth;
using ddprun::JobHealthRules;
using ddprun::NodeHealth;
using namespace std::chrono_literals;
using Us = std::chrono::microseconds;

namespace {

NodeHealth health(std::map<int, double> steps, std::map<std::string, std::chrono::milliseconds> sections = {}) {
  return NodeHealth{std::move(steps), std::move(sections)};
}

}  // namespace

TEST_CASE("job health: a straggler on one node is named against every node's ranks", "[rendezvous][straggler]") {
  JobHealth h;
  // Node a's ranks alone look even; rank 3 on node b is slow against the whole job.
  CHECK_FALSE(h.update("a", health({{0, 0.10}, {1, 0.11}}), Us(0s)));
  auto told = h.update("b", health({{2, 0.10}, {3, 0.30}}), Us(2s));
  REQUIRE(told);
  REQUIRE(told->view.stragglers.size() == 1);
  CHECK(told->view.stragglers[0].rank == 3);
  CHECK(told->view.stragglers[0].node == "b");
  CHECK(told->view.ranks == 4);
  CHECK(told->view.medianSeconds == Approx(0.105));
  // Nothing new: not told again.
  CHECK_FALSE(h.update("b", health({{2, 0.10}, {3, 0.31}}), Us(4s)));
  // It recovers: told (no stragglers).
  told = h.update("b", health({{2, 0.10}, {3, 0.10}}), Us(6s));
  REQUIRE(told);
  CHECK(told->view.stragglers.empty());
}

TEST_CASE("job health: the longest interval per section on any node, recomputed at most every second",
          "[rendezvous][hang]") {
  JobHealth h;
  auto told = h.update("a", health({}, {{"", 200ms}, {"checkpoint", 9s}}), Us(0s));
  REQUIRE(told);
  CHECK(told->view.sections.at("checkpoint") == 9s);
  // Within the second: not recomputed yet; tick() does it later.
  CHECK_FALSE(h.update("b", health({}, {{"checkpoint", 20s}}), Us(500ms)));
  told = h.tick(Us(1500ms));
  REQUIRE(told);
  CHECK(told->view.sections.at("checkpoint") == 20s);
  CHECK(told->view.sections.at("") == 200ms);
  CHECK(h.reporters() == std::vector<std::string>{"a", "b"});
  h.forget("b");
  CHECK(h.reporters() == std::vector<std::string>{"a"});
}

TEST_CASE("job health: what a node reports is bounded", "[rendezvous]") {
  JobHealthRules rules;
  rules.maxRanksPerNode = 3;
  rules.maxSections = 2;
  JobHealth h(rules);
  std::map<int, double> steps;
  for (int r = 0; r < 100; ++r) steps[r] = 0.1;
  steps[-5] = 9;  // nonsense is dropped
  auto told = h.update("a", health(steps, {{"x", 1s}, {"y", 1s}, {"z", 1s}, {std::string(100, 'q'), 1s}}), Us(0s));
  REQUIRE(told);
  CHECK(told->view.ranks == 3);
  CHECK(told->view.sections.size() == 2);
}

TEST_CASE("rules host: heartbeats with health reach the members that report theirs", "[rendezvous][straggler]") {
  using namespace ddprun::state_machine_test;
  ddprun::RulesHost host("job", rules(2, 2), sec(0));
  host.join(ddprun::Admitted{nodeInfo("a"), rules(2, 2), ""}, sec(1));
  host.join(ddprun::Admitted{nodeInfo("b"), rules(2, 2), ""}, sec(1));
  host.report("a", ddprun::AgentReport::heartbeat(1, health({{0, 0.1}})), sec(2));
  auto fx = host.report("b", ddprun::AgentReport::heartbeat(1, health({{1, 0.5}})), sec(4));
  CHECK(render(fx.notices) == Lines{"a: health ranks=2 stragglers=1@b,", "b: health ranks=2 stragglers=1@b,"});
  // A plain heartbeat says nothing new.
  CHECK(host.report("a", ddprun::AgentReport::heartbeat(1), sec(5)).notices.empty());
}

// The race the fresh-clone CI hit (test_stragglers_multinode): node b's report alone names its own
// slow rank; node a reports afterwards and the straggler set does not change, yet node a must be
// told too, or it never names the straggler.
TEST_CASE("rules host: a member that starts reporting after the view was told is told it too",
          "[rendezvous][straggler]") {
  using namespace ddprun::state_machine_test;
  ddprun::RulesHost host("job", rules(2, 2), sec(0));
  host.join(ddprun::Admitted{nodeInfo("a"), rules(2, 2), ""}, sec(1));
  host.join(ddprun::Admitted{nodeInfo("b"), rules(2, 2), ""}, sec(1));
  auto fx = host.report("b", ddprun::AgentReport::heartbeat(1, health({{2, 0.001}, {3, 0.030}})), sec(2));
  CHECK(render(fx.notices) == Lines{"b: health ranks=2 stragglers=3@b,"});
  // Node a's first report, within the second: not recomputed yet, told at the next tick.
  fx = host.report("a", ddprun::AgentReport::heartbeat(1, health({{0, 0.001}, {1, 0.001}})), sec(2) + Us(300ms));
  CHECK(fx.notices.empty());
  fx = host.tick(sec(4));
  CHECK(render(fx.notices) == Lines{"a: health ranks=4 stragglers=3@b,"});
  // Told once: nothing new after that.
  CHECK(host.tick(sec(6)).notices.empty());
  CHECK(host.report("a", ddprun::AgentReport::heartbeat(1, health({{0, 0.001}, {1, 0.002}})), sec(7)).notices.empty());
}

TEST_CASE("job health: a node forgotten and reporting again is told the standing view", "[rendezvous][straggler]") {
  JobHealth h;
  auto told = h.update("b", health({{2, 0.10}, {3, 0.30}, {4, 0.10}}), Us(0s));
  REQUIRE(told);
  CHECK(told->nodes == std::vector<std::string>{"b"});
  told = h.update("a", health({{0, 0.10}}), Us(2s));
  REQUIRE(told);
  CHECK(told->nodes == std::vector<std::string>{"a"});
  CHECK(told->view.stragglers.size() == 1);
  h.forget("a");
  CHECK_FALSE(h.tick(Us(4s)));
  told = h.update("a", health({{0, 0.10}}), Us(6s));
  REQUIRE(told);
  CHECK(told->nodes == std::vector<std::string>{"a"});
  // A view with nothing in it is not worth a catch-up.
  JobHealth quiet;
  CHECK_FALSE(quiet.update("a", health({{0, 0.10}, {1, 0.10}}), Us(0s)));
  CHECK_FALSE(quiet.update("b", health({{2, 0.10}}), Us(2s)));
}
