// decideExit: one exit status for the job on every node, and what each node says.
#include "agent/exit_decision.h"

#include <catch2/catch.hpp>

#include "common/exit_codes.h"

using ddprun::decideExit;
using ddprun::FailureReportInput;
using ddprun::JobClosure;
using ddprun::JobOutcome;
using ddprun::WorkerFailure;

namespace {

FailureReportInput ownFailure(int rank, int exitCode) {
  FailureReportInput report;
  report.first.rank = rank;
  report.first.exitCode = exitCode;
  return report;
}

}  // namespace

TEST_CASE("exit: a job that succeeded exits 0 and says nothing", "[agent][exit]") {
  JobClosure closure;
  closure.outcome = JobOutcome::kSucceeded;
  const auto d = decideExit(closure, std::nullopt);
  CHECK(d.status == 0);
  CHECK_FALSE(d.printReport);
  CHECK(d.error.empty());
}

TEST_CASE("exit: every node exits with the job's first failure, and the node that had it prints its report",
          "[agent][exit]") {
  JobClosure closure;
  closure.reason = "a worker failed";
  closure.failure = WorkerFailure{3, 7, 0, 7, "failed with exit code 7"};
  closure.failedNode = "node-a";
  const auto own = decideExit(closure, ownFailure(3, 7));
  CHECK(own.status == 7);
  CHECK(own.printReport);
  CHECK(own.error.empty());

  const auto elsewhere = decideExit(closure, std::nullopt);
  CHECK(elsewhere.status == 7);
  CHECK_FALSE(elsewhere.printReport);
  CHECK(elsewhere.error == "job failed: worker rank 3 on node node-a failed with exit code 7 (a worker failed)");

  const auto secondHere = decideExit(closure, ownFailure(5, 9));  // failed too, after the job's first
  CHECK(secondHere.status == 7);
  CHECK(secondHere.printReport);
  CHECK_THAT(secondHere.error, Catch::StartsWith("job failed: worker rank 3"));
}

TEST_CASE("exit: without a worker failure the closure's status, and an excluded node exits 201", "[agent][exit]") {
  JobClosure closure;
  closure.reason = "the rendezvous is gone";
  const auto infra = decideExit(closure, std::nullopt);
  CHECK(infra.status == ddprun::kExitInfrastructure);
  CHECK(infra.error == "job failed: the rendezvous is gone");

  closure.exitStatus = ddprun::kExitExcluded;
  closure.reason = "node excluded";
  const auto excluded = decideExit(closure, ownFailure(0, 1));
  CHECK(excluded.status == ddprun::kExitExcluded);
  CHECK(excluded.printReport);
  CHECK_THAT(excluded.error, Catch::StartsWith("node excluded; the job goes on without this node. Exit 201"));

  const auto ownOnly = decideExit(JobClosure{JobOutcome::kFailed, "x", std::nullopt, "", 200}, ownFailure(0, 4));
  CHECK(ownOnly.status == 4);
  CHECK(ownOnly.error.empty());
}
