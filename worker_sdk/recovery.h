// In-process recovery for C++ trainers (ddprun --recovery=in_process; DESIGN.md section 11), the
// counterpart of the Python package's ddprun.recovery.run: when a rank fails, ddprun replaces only
// that rank and tells every live one, on its heartbeat channel, its place in the next round
// (recovery_notice.h). runRecoverable() then tears the round's communicator down, builds the next
// one, brings every rank to the state of the rank with the most committed steps, and calls the
// training function again at that step. The process, its memory and its data stay.
//
//   ddp::RecoverableOptions options;
//   options.env = ddp::Env::fromEnviron();
//   ddp::runRecoverable(options, [&](ddp::RecoveryContext& ctx) {
//     for (int64_t step = ctx.step(); step < steps; ++step) {
//       ... forward, backward, ctx.communicator().allReduce(...), optimizer ...
//       ctx.commit(step + 1);  // the state now holds step + 1 steps; throws RoundOver on a notice
//     }
//   }, ddp::RecoveryState{.save = [&] { return model.bytes(); },
//                         .load = [&](std::string_view b) { model.load(b); }});
//
// The contract for `train`: change the state only with results of collectives that completed (a
// failed step must leave the state as of the last commit), and let RoundOver and the
// communicator's errors through.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/error.h"
#include "worker_sdk/communicator.h"
#include "worker_sdk/env.h"
#include "worker_sdk/store.h"

namespace ddp {

// Thrown by RecoveryContext::commit() when ddprun announced a new round: train() unwinds at a step
// boundary and runRecoverable() starts the next round. A catch-all in train() must rethrow it.
class RoundOver : public ddprun::Error {
 public:
  using ddprun::Error::Error;
};

// The training state as bytes: save() on the rank that has the most committed steps, load() on
// the others. Called on the thread that called runRecoverable(), between rounds only.
struct RecoveryState {
  std::function<std::string()> save;
  std::function<void(std::string_view)> load;
};

struct RecoverableOptions {
  Env env;  // this process's job environment (Env::fromEnviron())
  Backend backend = Backend::kGloo;
  // The communicator of each round; its name is suffixed ".round<R>" per round, so that a
  // store shared by rounds never mixes two rounds' bootstrap keys.
  CommunicatorOptions communicator;
  // How long a rank waits for ddprun's notice after a fault before it gives up (and rethrows).
  std::chrono::milliseconds noticeTimeout = std::chrono::seconds(60);
  // How often the monitor thread reads the channel while train() runs: the delay between a
  // notice and the abort of a collective that waits on a dead peer.
  std::chrono::milliseconds monitorInterval = std::chrono::milliseconds(50);
  // While a collective of train() waits on its peers, or a wait for a notice runs, a beat at
  // least this often (with the last committed step): a rank waiting on its peers is alive, so that
  // --hang_timeout picks the hung rank, not those waiting for it. A rank busy in its own code beats
  // only at its commits.
  std::chrono::milliseconds beatInterval = std::chrono::seconds(1);
  // Rounds this process may recover into before a fault is final.
  int maxRecoveries = 1000;
  // The largest state a rank accepts from its peer (the size is agreed before the bytes).
  std::size_t maxStateBytes = std::size_t{1} << 36;
  // Whether ddprun recovers ranks in place; nullopt: DDPRUN_RECOVERY == "in_process".
  std::optional<bool> inProcess;
  // The store of a round, from the round's environment. Empty: makeStore(env, storeTimeout).
  std::function<std::shared_ptr<Store>(const Env&)> makeStore;
  std::chrono::milliseconds storeTimeout = Store::kDefaultTimeout;
};

// What train() sees of the round it runs in.
class RecoveryContext {
 public:
  int rank() const { return env_.rank; }
  int worldSize() const { return env_.worldSize; }
  uint64_t round() const { return env_.round; }
  const Env& env() const { return env_; }
  // The committed step every rank resumes at (0 in a fresh job): the state holds that many steps.
  int64_t step() const { return step_; }
  Communicator& communicator() { return communicator_; }

  // The state now holds `step` steps: beats with it (thinned as Heartbeat thins), and throws
  // RoundOver when ddprun announced a new round.
  void commit(int64_t step);

  class Impl;  // recovery.cc's monitor: the committed step, the beats, the notice

 private:
  friend int runRecoverable(const RecoverableOptions&, const std::function<void(RecoveryContext&)>&,
                            const RecoveryState&);
  RecoveryContext(const Env& env, int64_t step, Communicator& communicator, Impl* impl)
      : env_(env), step_(step), communicator_(communicator), impl_(impl) {}
  const Env& env_;
  const int64_t step_;
  Communicator& communicator_;
  Impl* impl_;  // null outside in-process recovery
};

// Runs train(ctx) under in-process recovery; returns how many times it recovered (0: no fault).
//
// Every round: makes the round's store and communicator, agrees on the state (every rank's
// committed step; the lowest rank with the most sends its save() bytes, the others load() them),
// then calls train. A monitor thread reads the notice channel meanwhile and aborts the
// communicator when a notice comes (a collective blocked on a dead peer returns with an error).
// On a fault (an exception out of a round: a collective failed, or RoundOver), aborts and
// destroys the communicator, waits up to noticeTimeout for the next notice, and starts the next
// round as it says. An exception of the rank's own code (not RoundOver nor a communicator's or
// store's error, with no notice pending) is first reported to the agent (a beat with failed=1),
// which replaces this rank. Without a notice then, rethrows the exception.
//
// Without a notice channel (options.env.heartbeatFd) or outside in-process recovery, runs train
// once (step 0, one communicator) and lets its exceptions through. In-process recovery sets SIGPIPE
// to SIG_IGN for the process when it is at its default (a write to a dead peer must fail, not
// kill a survivor); a handler the program installed is left alone.
int runRecoverable(const RecoverableOptions& options, const std::function<void(RecoveryContext&)>& train,
                   const RecoveryState& state);

// Whether ddprun runs this job with --recovery=in_process (DDPRUN_RECOVERY=in_process).
bool inProcessRecoveryRequested();

// Whether this process is a warm spare (ddprun --spares_per_node sets DDPRUN_SPARE=1): not a rank
// yet, it has none of a rank's variables, and Env::fromEnviron() would refuse its environment.
bool isWarmSpare();

// A warm spare, its set-up done, waits here until ddprun makes it a rank (a notice on its channel),
// and returns that rank's Env, for RecoverableOptions::env; runRecoverable then brings it to its
// peers' state. nullopt when the agent is gone (the channel closed), there is no channel, or
// `timeout` passed (nullopt: no bound; a spare waits as long as its agent lives).
//   ddp::Env env = ddp::isWarmSpare() ? ddp::waitAsSpare().value() : ddp::Env::fromEnviron();
std::optional<Env> waitAsSpare(std::optional<std::chrono::milliseconds> timeout = std::nullopt);
// The same with the process's variables given (tests, programs that build their own environment).
std::optional<Env> waitAsSpare(const std::map<std::string, std::string>& vars,
                               std::optional<std::chrono::milliseconds> timeout = std::nullopt);

}  // namespace ddp
