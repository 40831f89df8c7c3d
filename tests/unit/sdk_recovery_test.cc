// ddp::runRecoverable with gloo: N ranks as N threads over one InProcessStore and loopback TCP (as
// gloo's own tests), each with a real heartbeat channel (a SOCK_SEQPACKET pair). The test thread
// plays the agent: it reads the ranks' beats on its ends and writes notices, as ddprun's agent
// does with --recovery=in_process. The model's update depends on every step's order, so a step
// skipped, repeated or taken from a stale state changes the final parameters.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/heartbeat_message.h"
#include "safety_bound.h"
#include "tests/support/sdk_ranks.h"
#include "worker_sdk/in_process_store.h"
#include "worker_sdk/recovery.h"

using namespace std::chrono_literals;

namespace {

constexpr int kWorld = 3;
constexpr int64_t kSteps = 12;
constexpr std::size_t kParams = 4;
constexpr int64_t kModulus = 1000000007;

// Rank r's gradient at step s: integers, so that sums are exact and every run bit-identical.
int64_t gradient(int64_t step, int rank, std::size_t i) {
  return (step + 1) * (rank + 2) + static_cast<int64_t>(i) * 7 + (step * step) % 5;
}

// The update mixes in the previous value: steps do not commute.
void applyUpdate(std::vector<int64_t>& params, const std::vector<int64_t>& sum) {
  for (std::size_t i = 0; i < kParams; ++i) params[i] = (params[i] * 3 + sum[i]) % kModulus;
}

// The parameters after kSteps steps of kWorld ranks, computed here without any communicator.
std::vector<int64_t> reference() {
  std::vector<int64_t> params(kParams, 1);
  for (int64_t s = 0; s < kSteps; ++s) {
    std::vector<int64_t> sum(kParams, 0);
    for (int r = 0; r < kWorld; ++r) {
      for (std::size_t i = 0; i < kParams; ++i) sum[i] += gradient(s, r, i);
    }
    applyUpdate(params, sum);
  }
  return params;
}

// A channel as the agent makes it; the test thread holds the agent's end.
struct Channel {
  int agent = -1;
  int worker = -1;
  Channel() {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) throw std::runtime_error("socketpair");
    agent = fds[0];
    worker = fds[1];
  }
  ~Channel() {
    if (agent >= 0) ::close(agent);
    ::close(worker);
  }
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  void send(const std::string& message) const { (void)::send(agent, message.data(), message.size(), MSG_NOSIGNAL); }
  // Every beat pending now, parsed by the agent's parser.
  std::vector<ddprun::HeartbeatMessage> beats() const {
    std::vector<ddprun::HeartbeatMessage> out;
    char buf[512];
    for (;;) {
      const ssize_t n = ::recv(agent, buf, sizeof(buf), MSG_DONTWAIT);
      if (n <= 0) return out;
      if (auto m = ddprun::parseHeartbeat(std::string_view(buf, static_cast<std::size_t>(n)))) out.push_back(*m);
    }
  }
};

std::string notice(uint64_t round, int rank, const std::string& reason) {
  return "recover round=" + std::to_string(round) + " restart=" + std::to_string(round) + " rank=" +
         std::to_string(rank) + " world=" + std::to_string(kWorld) + " local_rank=" + std::to_string(rank) +
         " master_addr=127.0.0.1 master_port=29500 reason=" + reason;
}

// What one rank's thread ends with.
struct RankResult {
  std::vector<int64_t> params = std::vector<int64_t>(kParams, 1);  // the model: a fresh rank's
  int recoveries = -1;
  std::string error;
  std::vector<int> ranksSeen;  // ctx.rank() of each round entered
};

// Called before each step's all-reduce (may throw, or wait).
using Hook = std::function<void(ddp::RecoveryContext&, int64_t step)>;

struct RankOptions {
  int rank = 0;
  uint64_t round = 0;
  int fd = -1;
  bool inProcess = true;
  std::chrono::milliseconds noticeTimeout = 20s;
  Hook hook{};
  std::optional<ddp::Env> env{};  // instead of rank, round and fd: a warm spare's, from its notice
  std::chrono::milliseconds beatInterval = 1s;
};

void runRank(ddp::InProcessStore& store, const RankOptions& ro, RankResult& out) {
  ddp::RecoverableOptions options;
  options.env = ddp::test::rankEnv(ro.rank, kWorld);
  options.env.round = ro.round;
  options.env.restartCount = static_cast<int>(ro.round);
  options.env.heartbeatFd = ro.fd;
  if (ro.env) options.env = *ro.env;
  options.backend = ddp::Backend::kGloo;
  options.communicator = ddp::test::testOptions(10s);  // bounds a collective on a peer that hangs
  options.noticeTimeout = ro.noticeTimeout;
  options.monitorInterval = 10ms;
  options.beatInterval = ro.beatInterval;
  options.inProcess = ro.inProcess;
  // One store for every round, not owned: the per-round communicator names keep rounds apart.
  options.makeStore = [&store](const ddp::Env&) { return std::shared_ptr<ddp::Store>(&store, [](ddp::Store*) {}); };
  ddp::RecoveryState state;
  state.save = [&out] {
    return std::string(reinterpret_cast<const char*>(out.params.data()), out.params.size() * sizeof(int64_t));
  };
  state.load = [&out](std::string_view bytes) {
    if (bytes.size() != kParams * sizeof(int64_t)) throw std::runtime_error("state of the wrong size");
    std::memcpy(out.params.data(), bytes.data(), bytes.size());
  };
  try {
    out.recoveries = ddp::runRecoverable(
        options,
        [&](ddp::RecoveryContext& ctx) {
          out.ranksSeen.push_back(ctx.rank());
          for (int64_t s = ctx.step(); s < kSteps; ++s) {
            if (ro.hook) ro.hook(ctx, s);
            std::vector<int64_t> sum(kParams);
            for (std::size_t i = 0; i < kParams; ++i) sum[i] = gradient(s, ctx.rank(), i);
            ctx.communicator().allReduce(std::span<int64_t>(sum), ddp::ReduceOp::kSum);
            applyUpdate(out.params, sum);  // only with a completed all-reduce: the contract
            ctx.commit(s + 1);
          }
        },
        state);
  } catch (const std::exception& e) {
    out.error = e.what();
  }
}

// Joins every thread it holds, also when a REQUIRE leaves the test early (each thread ends on its
// own: collectives and notice waits are bounded).
struct Threads {
  std::vector<std::thread> threads;
  ~Threads() { joinAll(); }
  void joinAll() {
    for (auto& t : threads) {
      if (t.joinable()) t.join();
    }
  }
};

// Waits up to the bound for a beat on `channel` that satisfies `pred`; keeps every beat read.
bool awaitBeat(const Channel& channel, const std::function<bool(const ddprun::HeartbeatMessage&)>& pred,
               std::vector<ddprun::HeartbeatMessage>& seen) {
  const auto deadline = std::chrono::steady_clock::now() + ddprun::test::kSafetyBound;
  while (std::chrono::steady_clock::now() < deadline) {
    for (auto& m : channel.beats()) {
      seen.push_back(m);
      if (pred(m)) return true;
    }
    std::this_thread::sleep_for(5ms);
  }
  return false;
}

}  // namespace

TEST_CASE("recoverable run, gloo, 3 ranks as threads: without a fault every rank ends at the reference, beats "
          "carry recoverable=1",
          "[recovery-sdk]") {
  ddp::InProcessStore store(ddp::InProcessStoreOptions{30s});
  Channel channels[kWorld];
  RankResult results[kWorld];
  {
    Threads threads;
    for (int r = 0; r < kWorld; ++r) {
      threads.threads.emplace_back([&, r] { runRank(store, RankOptions{.rank = r, .fd = channels[r].worker}, results[r]); });
    }
  }
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r);
    CHECK(results[r].error.empty());
    CHECK(results[r].recoveries == 0);
    CHECK(results[r].params == reference());
    const auto beats = channels[r].beats();
    REQUIRE_FALSE(beats.empty());
    CHECK(beats.front().recoverable);  // opted in before the first collective
    CHECK(beats.front().rank == r);
    for (const auto& b : beats) CHECK_FALSE(b.failed);
    CHECK_FALSE(beats.back().recoverable);  // and out when the run ended
  }
}

TEST_CASE("recoverable run: a rank busy in its own code falls silent, its peers waiting on it in a collective beat", "[recovery-sdk]") {
  // As the Python API: only the rank hung in its own code is silent, so that --hang_timeout ends
  // that one, not the ranks that wait for it.
  ddp::InProcessStore store(ddp::InProcessStoreOptions{30s});
  Channel channels[kWorld];
  RankResult results[kWorld];
  const auto stall = [](ddp::RecoveryContext& ctx, int64_t step) {
    if (ctx.rank() == 0 && step == 2) std::this_thread::sleep_for(900ms);  // its own code, no collective
  };
  {
    Threads threads;
    for (int r = 0; r < kWorld; ++r) {
      threads.threads.emplace_back([&, r] {
        runRank(store, RankOptions{.rank = r, .fd = channels[r].worker, .hook = stall, .beatInterval = 50ms},
                results[r]);
      });
    }
  }
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r);
    CHECK(results[r].error.empty());
    CHECK(results[r].params == reference());
    int atStep2 = 0;
    for (const auto& b : channels[r].beats()) atStep2 += b.step == 2 ? 1 : 0;
    // 900 ms with step 2 committed: the waiting ranks beat about every 100 ms (Heartbeat's thinning),
    // the stalled one only at its commit (and perhaps a held-back beat).
    if (r == 0) {
      CHECK(atStep2 <= 2);
    } else {
      CHECK(atStep2 >= 4);
    }
  }
}

TEST_CASE("recoverable run: a write to a dead peer is an error, not a SIGPIPE that kills the survivor", "[recovery-sdk]") {
  // Under ddprun a survivor of a killed peer wrote to its closed connection and died of SIGPIPE
  // (1 run in ~10 of test_in_process_recovery_cpp.py), making the recovery a restart of every rank.
  struct sigaction old{};
  struct sigaction dfl{};
  dfl.sa_handler = SIG_DFL;
  ::sigaction(SIGPIPE, &dfl, &old);
  ddp::InProcessStore store(ddp::InProcessStoreOptions{30s});
  Channel channel;
  ddp::RecoverableOptions options;
  options.env = ddp::test::rankEnv(0, 1);
  options.env.heartbeatFd = channel.worker;
  options.inProcess = true;
  options.communicator.name = "sigpipe";
  options.makeStore = [&store](const ddp::Env&) { return std::shared_ptr<ddp::Store>(&store, [](ddp::Store*) {}); };
  int pair[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) == 0);
  ::close(pair[1]);  // the peer is gone
  ssize_t wrote = 0;
  int error = 0;
  CHECK(ddp::runRecoverable(options,
                            [&](ddp::RecoveryContext& ctx) {
                              wrote = ::write(pair[0], "x", 1);  // as a transport that forgot MSG_NOSIGNAL
                              error = errno;
                              ctx.commit(1);
                            },
                            {}) == 0);
  ::close(pair[0]);
  CHECK(wrote == -1);
  CHECK(error == EPIPE);
  ::sigaction(SIGPIPE, &old, nullptr);
}

TEST_CASE("recoverable run, gloo, 3 ranks as threads: rank 2 throws at step 5, reports failed=1 and leaves, the "
          "survivors take the notice, a replacement joins (a fresh process or a warm spare), every rank ends at the "
          "reference",
          "[recovery-sdk]") {
  ddp::InProcessStore store(ddp::InProcessStoreOptions{30s});
  Channel channels[kWorld];
  Channel replacementChannel;
  RankResult results[kWorld];
  RankResult replacement;
  Threads threads;
  for (int r = 0; r < kWorld; ++r) {
    RankOptions ro{.rank = r, .fd = channels[r].worker};
    if (r == 2) {
      ro.hook = [](ddp::RecoveryContext&, int64_t s) {
        if (s == 5) throw std::runtime_error("injected failure in rank 2's own code");
      };
      ro.noticeTimeout = 0ms;  // the agent ends this rank: here, it leaves at once
    }
    threads.threads.emplace_back([&, r, ro] { runRank(store, ro, results[r]); });
  }

  // The agent: rank 2's own failure comes as a beat with failed=1.
  std::vector<ddprun::HeartbeatMessage> seen;
  REQUIRE(awaitBeat(channels[2], [](const auto& m) { return m.failed; }, seen));
  CHECK(seen.back().recoverable);
  CHECK(seen.back().rank == 2);
  threads.threads[2].join();
  CHECK_THAT(results[2].error, Catch::Matchers::Contains("injected failure"));
  for (int r = 0; r < 2; ++r) {
    std::vector<ddprun::HeartbeatMessage> survivor;
    REQUIRE(awaitBeat(channels[r], [](const auto& m) { return m.recoverable; }, survivor));
    for (const auto& b : survivor) CHECK_FALSE(b.failed);
    channels[r].send(notice(1, r, "rank 2 failed"));
  }
  std::optional<ddp::Env> spareEnv;
  SECTION("replaced by a fresh process") {
    threads.threads.emplace_back([&] {
      runRank(store, RankOptions{.rank = 2, .round = 1, .fd = replacementChannel.worker}, replacement);
    });
  }
  SECTION("replaced by a warm spare that waited, not a rank, for its notice") {
    threads.threads.emplace_back([&] {
      try {
        spareEnv = ddp::waitAsSpare({{"DDPRUN_SPARE", "1"},
                                     {"DDPRUN_ROUND", "0"},
                                     {"DDPRUN_HEARTBEAT_FD", std::to_string(replacementChannel.worker)}},
                                    ddprun::test::kSafetyBound);
      } catch (const std::exception& e) {
        replacement.error = e.what();
        return;
      }
      if (spareEnv) runRank(store, RankOptions{.env = spareEnv}, replacement);
    });
    const std::string contract = " env.LOCAL_WORLD_SIZE=3 env.GROUP_RANK=0 env.GROUP_WORLD_SIZE=1 reason=";
    std::string activation = notice(1, 2, "spare0 takes rank 2");
    activation.replace(activation.find(" reason="), 8, contract);
    replacementChannel.send(activation);
  }
  threads.joinAll();
  if (spareEnv) {
    CHECK(spareEnv->rank == 2);
    CHECK(spareEnv->round == 1);
    CHECK(spareEnv->localWorldSize == 3);
    CHECK(spareEnv->heartbeatFd == replacementChannel.worker);
  }

  for (int r = 0; r < 2; ++r) {
    INFO("survivor " << r << ": " << results[r].error);
    CHECK(results[r].error.empty());
    CHECK(results[r].recoveries == 1);
    CHECK(results[r].ranksSeen == std::vector<int>{r, r});
    CHECK(results[r].params == reference());
  }
  INFO("replacement: " << replacement.error);
  CHECK(replacement.error.empty());
  CHECK(replacement.recoveries == 0);
  CHECK(replacement.params == reference());  // loaded the survivors' state at step 5, then on
}

TEST_CASE("recoverable run, gloo, 3 ranks as threads: a notice without a failure ends the round at commit "
          "(RoundOver), ranks renumbered, and the run ends at the reference",
          "[recovery-sdk]") {
  ddp::InProcessStore store(ddp::InProcessStoreOptions{30s});
  Channel channels[kWorld];
  RankResult results[kWorld];
  std::atomic<int> waiting{0};
  std::atomic<int> roundOvers{0};
  Threads threads;
  for (int r = 0; r < kWorld; ++r) {
    RankOptions ro{.rank = r, .fd = channels[r].worker};
    ro.hook = [&](ddp::RecoveryContext& ctx, int64_t s) {
      if (ctx.round() != 0 || s != 6) return;
      // At a step boundary: commit until the notice ends the round, bounded.
      ++waiting;
      const auto deadline = std::chrono::steady_clock::now() + ddprun::test::kSafetyBound;
      while (std::chrono::steady_clock::now() < deadline) {
        try {
          ctx.commit(6);
        } catch (const ddp::RoundOver&) {
          ++roundOvers;
          throw;
        }
        std::this_thread::sleep_for(2ms);
      }
      throw std::runtime_error("no RoundOver within the bound");
    };
    threads.threads.emplace_back([&, r, ro] { runRank(store, ro, results[r]); });
  }
  const auto deadline = std::chrono::steady_clock::now() + ddprun::test::kSafetyBound;
  while (waiting.load() < kWorld && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(2ms);
  REQUIRE(waiting.load() == kWorld);
  // Round 1 swaps ranks 0 and 2 (a round may renumber its ranks).
  const int renumbered[kWorld] = {2, 1, 0};
  for (int r = 0; r < kWorld; ++r) channels[r].send(notice(1, renumbered[r], "a node joined"));
  threads.joinAll();

  CHECK(roundOvers.load() == kWorld);
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r << ": " << results[r].error);
    CHECK(results[r].error.empty());
    CHECK(results[r].recoveries == 1);
    CHECK(results[r].ranksSeen == std::vector<int>{r, renumbered[r]});
    CHECK(results[r].params == reference());
    const auto beats = channels[r].beats();
    REQUIRE_FALSE(beats.empty());
    CHECK(beats.back().rank == renumbered[r]);  // beats name the rank of the new round
  }
}

TEST_CASE("recoverable run outside --recovery=in_process or without a channel: train runs once and its error goes "
          "through, no failed=1",
          "[recovery-sdk]") {
  ddp::InProcessStore store(ddp::InProcessStoreOptions{30s});
  Channel channel;
  ddp::RecoverableOptions options;
  options.env = ddp::test::rankEnv(0, 1);
  options.env.heartbeatFd = channel.worker;
  options.inProcess = false;
  options.makeStore = [&store](const ddp::Env&) { return std::shared_ptr<ddp::Store>(&store, [](ddp::Store*) {}); };
  int calls = 0;
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(ddp::runRecoverable(
                        options,
                        [&](ddp::RecoveryContext& ctx) {
                          ++calls;
                          CHECK(ctx.step() == 0);
                          ctx.commit(1);
                          throw std::runtime_error("boom");
                        },
                        {}),
                    "boom");
  CHECK(calls == 1);
  CHECK(std::chrono::steady_clock::now() - start < ddprun::test::kSafetyBound);  // no wait for a notice
  for (const auto& b : channel.beats()) {
    CHECK_FALSE(b.failed);
    CHECK_FALSE(b.recoverable);
  }

  // In-process recovery asked for, but no channel to hear a notice on: the same.
  options.inProcess = true;
  options.env.heartbeatFd = -1;
  options.communicator.name = "no-channel";
  CHECK_THROWS_WITH(ddp::runRecoverable(
                        options, [&](ddp::RecoveryContext&) { ++calls; throw std::runtime_error("boom again"); }, {}),
                    "boom again");
  CHECK(calls == 2);
  CHECK(std::chrono::steady_clock::now() - start < ddprun::test::kSafetyBound);
}

TEST_CASE("warm spare: waits for its notice, bounded, no rank without the notice's contract, none when the agent is "
          "gone",
          "[recovery-sdk]") {
  Channel channel;
  const std::map<std::string, std::string> vars = {{"DDPRUN_SPARE", "1"},
                                                    {"DDPRUN_ROUND", "4"},
                                                    {"DDPRUN_RUN_ID", "job1"},
                                                    {"DDPRUN_STORE_ADDR", "10.0.0.1:29400"},
                                                    {"DDPRUN_STORE_PREFIX", "/run/job1/round/4/"},
                                                    {"DDPRUN_HEARTBEAT_FD", std::to_string(channel.worker)}};
  // Nothing comes: the bound ends the wait.
  auto start = std::chrono::steady_clock::now();
  CHECK_FALSE(ddp::waitAsSpare(vars, 100ms));
  CHECK(std::chrono::steady_clock::now() - start >= 90ms);

  // A stale notice is no activation; one without LOCAL_WORLD_SIZE cannot make a rank's contract.
  channel.send("recover round=4 restart=0 rank=0 world=2 local_rank=0 master_addr=h master_port=9 reason=old");
  CHECK_FALSE(ddp::waitAsSpare(vars, 100ms));
  channel.send("recover round=5 restart=1 rank=1 world=2 local_rank=1 master_addr=h master_port=9 reason=r");
  CHECK_THROWS_AS(ddp::waitAsSpare(vars, 5s), ddprun::ConfigError);

  channel.send("recover round=6 restart=2 rank=1 world=2 local_rank=1 master_addr=h master_port=9 "
               "env.LOCAL_WORLD_SIZE=2 env.GROUP_RANK=0 env.GROUP_WORLD_SIZE=1 "
               "env.DDPRUN_STORE_PREFIX=/run/job1/round/6/ reason=spare0 takes rank 1");
  const auto env = ddp::waitAsSpare(vars, 5s);
  REQUIRE(env);
  CHECK(env->rank == 1);
  CHECK(env->worldSize == 2);
  CHECK(env->localRank == 1);
  CHECK(env->localWorldSize == 2);
  CHECK(env->round == 6);
  CHECK(env->restartCount == 2);
  CHECK(env->storeAddr == "10.0.0.1:29400");
  CHECK(env->storePrefix == "/run/job1/round/6/");  // the spare's own prefix named round 4
  CHECK(env->heartbeatFd == channel.worker);

  // The agent gone: the wait ends at once, even unbounded.
  ::close(channel.agent);
  channel.agent = -1;
  start = std::chrono::steady_clock::now();
  CHECK_FALSE(ddp::waitAsSpare(vars));
  CHECK(std::chrono::steady_clock::now() - start < ddprun::test::kSafetyBound);
  CHECK_FALSE(ddp::waitAsSpare({{"DDPRUN_SPARE", "1"}}));  // no channel at all
}
