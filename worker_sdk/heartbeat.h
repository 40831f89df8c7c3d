// Tells the agent that this rank makes progress: beat(step) sends "RANK STEP[ section=NAME]
// [ time=S]\n" (docs/heartbeat.md) on the worker's end of its channel to the agent, inherited as
// the descriptor DDPRUN_HEARTBEAT_FD names, or, for a process that did not inherit it, as a
// datagram to the unix socket DDPRUN_HEARTBEAT_SOCKET names ('@' starts a Linux abstract-namespace
// name). A rank stuck in a collective is so found without waiting out the collective's timeout.
// Without either variable every call does nothing. Never blocks and never throws: a heartbeat the
// agent misses is the agent's problem, not the training's. One thread at a time, as the Python
// package's is per process.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "worker_sdk/env.h"

namespace ddp {

struct HeartbeatOptions {
  std::string socket;  // a path, or '@' + an abstract name; empty: none
  int rank = 0;
  // Beats closer together than this are not sent (the next one after it carries the latest step,
  // and the mean step time of the steps in between): a step of a millisecond must not pay a
  // message and a wake-up of the agent each time (bench/RESULTS_HANGS.md). Hang bounds are
  // seconds, so a tenth of a second of lag changes nothing. A section change always goes.
  std::chrono::milliseconds minInterval{100};
  // The inherited end of the channel (DDPRUN_HEARTBEAT_FD), preferred over `socket` when it is a
  // unix packet socket; -1: none. Not closed by the Heartbeat (it uses a duplicate of its own).
  int fd = -1;
};

class Heartbeat {
 public:
  // env.heartbeatFd, env.heartbeatSocket and env.rank.
  explicit Heartbeat(const Env& env);
  explicit Heartbeat(HeartbeatOptions options);
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // This rank reached `step`. `stepSeconds`: the rank's own work in the step (data, forward,
  // backward, optimizer; not the wait for its peers), such as GradientReducer::takeStepSeconds()
  // gives, from which the agent finds stragglers; a value that is not finite or not within
  // [0, 86400] is not sent. A beat within minInterval of the last is held back (the destructor
  // sends the last one held); the step times of held beats go, averaged, with the next one.
  void beat(int64_t step, std::optional<double> stepSeconds = std::nullopt) noexcept;

  // A named phase (a checkpoint, an evaluation): beats on entry and on leaving, and a rank
  // declared hung inside it is reported with the section's name. Sections nest. The name is made
  // one token of [A-Za-z0-9._:-], at most 64 bytes, as the Python package's ddprun.section().
  // A Section must not outlive its Heartbeat.
  class Section {
   public:
    ~Section();
    Section(const Section&) = delete;
    Section& operator=(const Section&) = delete;

   private:
    friend class Heartbeat;
    Section(Heartbeat& heartbeat, std::string name);
    Heartbeat& heartbeat_;
    std::string name_;
  };
  [[nodiscard]] Section section(std::string_view name);

  // Whether beats are sent anywhere (a channel was inherited, or a socket was named and created).
  bool enabled() const { return fd_ >= 0; }

  // In-process recovery (ddp::runRecoverable, ddprun --recovery=in_process): while on, every beat
  // carries "recoverable=1", which tells the agent to keep this rank running when a peer fails
  // and to send it a notice of the next round instead. Beats at once when it changes.
  void setRecoverable(bool on) noexcept;
  // This rank's own code failed (not a peer's failure): beats at once with "failed=1", so that the
  // agent ends and replaces it without its peers waiting out a collective's timeout. Only that
  // beat carries the token.
  void reportFailed() noexcept;

 private:
  const HeartbeatOptions options_;
  int fd_ = -1;
  // The peer's sockaddr_un, kept as bytes so this header needs no system headers; empty on the
  // inherited channel, which is connected.
  std::string address_;
  std::vector<std::string> sections_;  // entered and not left, innermost last
  void send(std::chrono::steady_clock::time_point now, bool failed = false) noexcept;
  void enter(std::string name) noexcept;
  void leave(const std::string& name) noexcept;

  int64_t step_ = 0;
  std::chrono::steady_clock::time_point lastSent_{};
  bool sent_ = false;
  std::string lastSection_;  // the section of the last beat sent
  bool pending_ = false;     // a beat was held back since the last one sent: the destructor sends it
  double timeSum_ = 0;       // step times of the beats since the last one sent
  int timeCount_ = 0;
  bool recoverable_ = false;  // setRecoverable()
};

}  // namespace ddp
