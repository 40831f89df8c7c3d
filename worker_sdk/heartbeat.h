// Tells the agent that this rank makes progress: beat(step) sends the datagram "RANK STEP\n" to
// the unix datagram socket named by DDPRUN_HEARTBEAT_SOCKET ('@' starts a Linux abstract-namespace
// name), so a rank stuck in a collective is found without waiting out the collective's timeout.
// Without the variable every call does nothing. Never blocks and never throws: a heartbeat the
// agent misses is the agent's problem, not the training's.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "worker_sdk/env.h"

namespace ddp {

struct HeartbeatOptions {
  std::string socket;  // a path, or '@' + an abstract name; empty: disabled
  int rank = 0;
  // Beats closer together than this are not sent (the next one after it carries the latest step,
  // and the mean compute time of the steps in between): a step of a millisecond must not pay a
  // datagram and a wake-up of the agent each time (bench/RESULTS_HANGS.md). Hang bounds are
  // seconds, so a tenth of a second of lag changes nothing.
  std::chrono::milliseconds minInterval{100};
};

class Heartbeat {
 public:
  // env.heartbeatSocket and env.rank.
  explicit Heartbeat(const Env& env);
  explicit Heartbeat(HeartbeatOptions options);
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // Sends "RANK STEP[ time=S]\n" unless the last beat went out less than minInterval ago (the
  // destructor then sends the last such step); drops it when the socket is full, gone or unusable.
  void beat(int64_t step) noexcept;
  // Whether beats are sent anywhere (a socket was named and could be created).
  bool enabled() const { return fd_ >= 0; }

 private:
  const HeartbeatOptions options_;
  int fd_ = -1;
  // The peer's sockaddr_un, kept as bytes so this header needs no system headers.
  std::string address_;
  void send(int64_t step, std::chrono::steady_clock::time_point now) noexcept;

  std::chrono::steady_clock::time_point lastSent_{};
  bool sent_ = false;
  bool pending_ = false;  // a beat was thinned since the last one sent: the destructor sends it
  int64_t pendingStep_ = 0;
};

}  // namespace ddp
