#include "agent/failure_report.h"

#include <signal.h>

#include <catch2/catch.hpp>

using ddprun::ErrorFileContent;
using ddprun::exitStatusOf;
using ddprun::formatFailureReport;
using ddprun::signalName;
using ddprun::WorkerExit;

TEST_CASE("signalName names signals the usual way", "[agent][report]") {
  CHECK(signalName(9) == "SIGKILL");
  CHECK(signalName(SIGTERM) == "SIGTERM");
  CHECK(signalName(SIGSEGV) == "SIGSEGV");
  CHECK(signalName(99) == "signal 99");
}

TEST_CASE("exitStatusOf gives the exit code, or 128+N for signal N", "[agent][report]") {
  WorkerExit exited;
  exited.exitCode = 3;
  CHECK(exitStatusOf(exited) == 3);

  WorkerExit killed;
  killed.exitCode = -1;
  killed.signal = 9;
  CHECK(exitStatusOf(killed) == 137);

  killed.signal = SIGTERM;
  CHECK(exitStatusOf(killed) == 143);
}

TEST_CASE("formatFailureReport names the failing worker, its error and its stderr", "[agent][report]") {
  ddprun::FailureReportInput in;
  in.program = "train.py";
  in.host = "node-a17";
  in.first.localRank = 1;
  in.first.rank = 9;
  in.first.pid = 43210;
  in.first.exitCode = 3;
  in.first.time = std::chrono::system_clock::now();
  in.errorFile = "/tmp/run/attempt_0/1/error.json";
  in.error = ErrorFileContent{"ValueError: boom", "Traceback (most recent call last):\n  File \"train.py\"\nValueError: boom", "1700000000"};
  in.stderrTail = {"warming up", "about to fail"};
  WorkerExit other;
  other.localRank = 0;
  other.rank = 8;
  other.exitCode = 5;
  in.others = {other};

  std::string report = formatFailureReport(in);
  CHECK_THAT(report, Catch::Contains("train.py FAILED"));
  CHECK_THAT(report, Catch::Contains("node-a17"));
  CHECK_THAT(report, Catch::Contains("rank      : 9 (local_rank: 1)"));
  CHECK_THAT(report, Catch::Contains("43210"));
  CHECK_THAT(report, Catch::Contains("exitcode  : 3"));
  CHECK_THAT(report, Catch::Contains("/tmp/run/attempt_0/1/error.json"));
  CHECK_THAT(report, Catch::Contains("ValueError: boom"));
  CHECK_THAT(report, Catch::Contains("Traceback (most recent call last):"));
  CHECK_THAT(report, Catch::Contains("File \"train.py\""));
  CHECK_THAT(report, Catch::Contains("warming up"));
  CHECK_THAT(report, Catch::Contains("about to fail"));
  CHECK_THAT(report, Catch::Contains("rank 8 (local_rank: 0): exitcode 5"));
}

TEST_CASE("formatFailureReport shows a signal by number and name", "[agent][report]") {
  ddprun::FailureReportInput in;
  in.program = "/bin/worker";
  in.host = "h";
  in.first.localRank = 0;
  in.first.rank = 0;
  in.first.pid = 77;
  in.first.exitCode = -1;
  in.first.signal = 9;
  std::string report = formatFailureReport(in);
  CHECK_THAT(report, Catch::Contains("-9 (SIGKILL)"));
  CHECK_THAT(report, !Catch::Contains("message   :"));  // no error file, no message line
  CHECK_THAT(report, !Catch::Contains("stderr (last"));
}

TEST_CASE("formatFailureReport explains a worker that could not start", "[agent][report]") {
  ddprun::FailureReportInput in;
  in.program = "/bin/worker";
  in.host = "h";
  in.first.exitCode = 127;
  in.first.spawnError = "exec failed: Permission denied";
  std::string report = formatFailureReport(in);
  CHECK_THAT(report, Catch::Contains("127"));
  CHECK_THAT(report, Catch::Contains("exec failed: Permission denied"));
  CHECK_THAT(report, !Catch::Contains("pid       :"));  // it never had one
}
