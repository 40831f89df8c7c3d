// WorkerFailure <-> ddprun.v1.WorkerFailed: a round trip keeps everything; what a peer sends is
// made valid (status 1..255, a description of one bounded line).
#include <catch2/catch.hpp>

#include "rendezvous/wire/worker_failure_message.h"

using ddprun::WorkerFailure;

TEST_CASE("worker failure message: a round trip keeps every field", "[rendezvous]") {
  ddprun::v1::WorkerFailed message;
  ddprun::toMessage(WorkerFailure{12, -1, 11, 139, "was killed by SIGSEGV"}, &message);
  const WorkerFailure back = ddprun::fromMessage(message);
  CHECK(back.rank == 12);
  CHECK(back.exitCode == -1);
  CHECK(back.signal == 11);
  CHECK(back.exitStatus == 139);
  CHECK(back.description == "was killed by SIGSEGV");
}

TEST_CASE("worker failure message: what a peer sends is made valid", "[rendezvous]") {
  ddprun::v1::WorkerFailed message;
  message.set_rank(-7);
  message.set_signal(-3);
  message.set_description("line one\nline two\x1b[31m" + std::string(1000, 'x'));
  for (int status : {0, -1, 256, 100000}) {
    message.set_exit_status(status);
    CHECK(ddprun::fromMessage(message).exitStatus == 1);  // a failed job never exits 0 or wraps
  }
  message.set_exit_status(255);
  const WorkerFailure f = ddprun::fromMessage(message);
  CHECK(f.exitStatus == 255);
  CHECK(f.rank == -1);
  CHECK(f.signal == 0);
  CHECK(f.description.size() == 256);
  CHECK(f.description.find('\n') == std::string::npos);
  CHECK(f.description.find('\x1b') == std::string::npos);
  CHECK(f.description.rfind("line one?line two?[31m", 0) == 0);
}
