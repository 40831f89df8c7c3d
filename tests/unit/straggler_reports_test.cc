// What the agent says of stragglers: this node's changes, and the job-wide view's differences.
#include "agent/straggler_reports.h"

#include <catch2/catch.hpp>

using ddprun::JobHealthView;
using ddprun::JobStragglers;
using ddprun::StragglerChange;

TEST_CASE("straggler reports: a rank of this node, and when it is back", "[agent][stragglers]") {
  const auto slow = ddprun::describeStraggler(StragglerChange{3, true, 0.04, 0.005, 4});
  CHECK(slow.line == "straggler: rank 3 takes 0.0400s of its own work per step (median of its last steps), 8.0x the "
                     "median 0.0050s of the 4 ranks on this node");
  CHECK(slow.reason == slow.line);
  CHECK_FALSE(slow.back);
  const auto back = ddprun::describeStraggler(StragglerChange{3, false, 0.006, 0.005, 4});
  CHECK(back.line == "straggler: rank 3 is back to 0.006s per step (median 0.005s)");
  CHECK(back.back);
}

TEST_CASE("straggler reports: across the job, each straggler once, and once when it is back", "[agent][stragglers]") {
  JobStragglers job;
  JobHealthView view;
  view.stragglers = {{7, 0.03, "node-b"}};
  view.medianSeconds = 0.01;
  view.ranks = 8;
  auto reports = job.update(view);
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].line == "straggler across the job: rank 7 on node node-b takes 0.0300s of its own work per step, "
                           "3.0x the job's median 0.0100s of 8 ranks");
  CHECK(reports[0].reason == "across the job, on node node-b: takes 0.0300s of its own work per step, 3.0x the job's "
                             "median 0.0100s of 8 ranks");
  CHECK(job.update(view).empty());  // told already
  view.stragglers.clear();
  reports = job.update(view);
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].back);
  CHECK(reports[0].line == "straggler across the job: rank 7 is back near the job's median");
}
