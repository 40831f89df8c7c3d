// In-process recovery's NCCL path on simulated devices (docs/simgpu.md): a rank that dies leaves
// its peers blocked in a collective that never completes (it never arrives, and it never aborts:
// a killed process tells nobody). A monitor thread (runRecoverable's, which reads the agent's
// notice) aborts the survivors' communicators; their blocked collective must fail promptly, not at
// its timeout, and a new communicator of the survivors must work afterwards.
#include <catch2/catch.hpp>

#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "safety_bound.h"
#include "tests/simgpu/simgpu_ranks.h"
#include "worker_sdk/recovery.h"

using Catch::Matchers::Contains;
using ddprun::test::kSafetyBound;
using simgpu::test::DeviceArray;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

template <typename Done>
bool within(Done done) {
  const auto deadline = Clock::now() + kSafetyBound;
  while (!done()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

}  // namespace

TEST_CASE("simgpu nccl: a collective blocked on a dead peer fails promptly when another thread aborts the "
          "communicator, and the survivors' next communicator works",
          "[simgpu][nccl][recovery-sdk]") {
  constexpr int kWorld = 3;
  constexpr int kDead = 2;
  ddp::InProcessStore store(ddp::InProcessStoreOptions{60s});
  std::unique_ptr<ddp::Communicator> comms[kWorld];
  std::atomic<int> made{0};
  std::atomic<int> entered{0};    // survivors about to block in the all-reduce
  std::atomic<bool> aborted{false};
  std::atomic<bool> survivorsDone{false};
  std::string errors[kWorld];       // the blocked all-reduce's error, per survivor
  Clock::time_point returned[kWorld]{};  // when the blocked all-reduce returned
  std::vector<float> after[kWorld];   // the survivors' next communicator's all-reduce
  std::string setupErrors[kWorld];
  std::atomic<int> nextDone{0};  // survivors through their next communicator's all-reduce
  Clock::time_point abortedAt;

  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      try {
        // A timeout far beyond the bound: only the abort can end the collective in time.
        comms[r] = ddp::makeCommunicator(ddp::Backend::kNccl, simgpu::test::rankEnv(r, kWorld), store,
                                         simgpu::test::options(10min));
        ++made;
        if (r == kDead) {
          // Dead: never enters the collective and never aborts (a killed process tells nobody);
          // its communicator goes only after the survivors moved on.
          within([&] { return survivorsDone.load(); });
          comms[r]->abort();
          comms[r].reset();
          return;
        }
        within([&] { return made.load() == kWorld; });
        DeviceArray<float> buf(std::vector<float>(8, 1.0f + static_cast<float>(r)));
        ++entered;
        try {
          comms[r]->allReduce(buf.get(), buf.get(), 8, ddp::DataType::kFloat32, ddp::ReduceOp::kSum);
          errors[r] = "(completed)";
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
        returned[r] = Clock::now();
        if (!aborted.load()) errors[r] += " (returned before the abort)";
        within([&] { return aborted.load(); });  // the monitor holds the pointer until it aborted
        comms[r].reset();

        // The next round: the survivors only, a communicator of its own name on the same devices.
        ddp::CommunicatorOptions next = simgpu::test::options(60s);
        next.name = "round1";
        auto comm = ddp::makeCommunicator(ddp::Backend::kNccl, simgpu::test::rankEnv(r, kWorld - 1), store, next);
        DeviceArray<float> again(std::vector<float>(8, 10.0f * static_cast<float>(r + 1)));
        comm->allReduce(again.get(), again.get(), 8, ddp::DataType::kFloat32, ddp::ReduceOp::kSum);
        after[r] = again.read();
        ++nextDone;
      } catch (const std::exception& e) {
        setupErrors[r] = e.what();
      }
    });
  }

  // The monitor: once both survivors are in the collective (and a little longer, so that they
  // block in it), abort their communicators from this thread.
  const bool inCollective = within([&] { return entered.load() == kWorld - 1; });
  std::this_thread::sleep_for(200ms);
  abortedAt = Clock::now();
  aborted = true;
  if (inCollective) {
    for (int r = 0; r < kWorld; ++r) {
      if (r != kDead) comms[r]->abort();
    }
  }
  // The survivors' next communicator is made before the dead rank's goes; the flag only ends it.
  within([&] { return nextDone.load() == kWorld - 1; });
  survivorsDone = true;
  for (auto& t : threads) t.join();

  REQUIRE(inCollective);
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r);
    CHECK(setupErrors[r] == "");
  }
  for (int r = 0; r < kWorld; ++r) {
    if (r == kDead) continue;
    INFO("survivor " << r);
    CHECK_THAT(errors[r], Contains("aborted"));
    CHECK_THAT(errors[r], !Contains("returned before the abort"));
    // The dead rank's own abort (which would tell the survivors) comes only after kSafetyBound.
    CHECK(returned[r] - abortedAt < kSafetyBound / 4);
    CHECK_THAT(errors[r], !Contains("peer rank"));
    CHECK(after[r] == std::vector<float>(8, 30.0f));  // 10 + 20: the two survivors
  }
}

namespace {

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
    ::close(agent);
    ::close(worker);
  }
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;
  void send(const std::string& message) const { (void)::send(agent, message.data(), message.size(), MSG_NOSIGNAL); }
};

constexpr int kRanks = 3;
constexpr int64_t kSteps = 10;

int64_t gradient(int64_t step, int rank) { return (step + 1) * (rank + 2) + (step * step) % 5; }
int64_t update(int64_t value, int64_t sum) { return (value * 3 + sum) % 1000000007; }

int64_t reference() {
  int64_t value = 1;
  for (int64_t s = 0; s < kSteps; ++s) {
    int64_t sum = 0;
    for (int r = 0; r < kRanks; ++r) sum += gradient(s, r);
    value = update(value, sum);
  }
  return value;
}

struct RankRun {
  int64_t value = 1;
  int recoveries = -1;
  std::string error;
};

// One rank under runRecoverable on the NCCL backend. `dieAt`: at that step the rank stops as a
// killed process does: it never enters the step's collective and tells nobody (train returns;
// its communicator is destroyed, not aborted, so its peers keep waiting for it).
void runRank(ddp::InProcessStore& store, int rank, uint64_t round, int fd, int64_t dieAt, RankRun& out) {
  ddp::RecoverableOptions options;
  options.env = simgpu::test::rankEnv(rank, kRanks);
  options.env.round = round;
  options.env.heartbeatFd = fd;
  options.backend = ddp::Backend::kNccl;
  options.communicator = simgpu::test::options(10min);  // only the monitor's abort ends a wait in time
  options.noticeTimeout = kSafetyBound;
  options.monitorInterval = 10ms;
  options.inProcess = true;
  options.makeStore = [&store](const ddp::Env&) { return std::shared_ptr<ddp::Store>(&store, [](ddp::Store*) {}); };
  ddp::RecoveryState state;
  state.save = [&out] { return std::to_string(out.value); };
  state.load = [&out](std::string_view bytes) { out.value = std::stoll(std::string(bytes)); };
  try {
    out.recoveries = ddp::runRecoverable(
        options,
        [&](ddp::RecoveryContext& ctx) {
          for (int64_t s = ctx.step(); s < kSteps; ++s) {
            if (s == dieAt) return;
            int64_t sum = gradient(s, ctx.rank());
            ctx.communicator().allReduceHost(std::span<int64_t>(&sum, 1));
            out.value = update(out.value, sum);
            ctx.commit(s + 1);
          }
        },
        state);
  } catch (const std::exception& e) {
    out.error = e.what();
  }
}

std::string notice(int rank) {
  return "recover round=1 restart=1 rank=" + std::to_string(rank) + " world=3 local_rank=" + std::to_string(rank) +
         " master_addr=127.0.0.1 master_port=29500 reason=rank 2 was lost";
}

}  // namespace

TEST_CASE("simgpu nccl: runRecoverable: survivors blocked on a rank that vanished are released by the notice's "
          "abort, a fresh rank joins on its device, state synced through device memory",
          "[simgpu][nccl][recovery-sdk]") {
  ddp::InProcessStore store(ddp::InProcessStoreOptions{60s});
  Channel channels[kRanks];
  Channel replacementChannel;
  RankRun runs[kRanks];
  RankRun replacement;
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] { runRank(store, r, 0, channels[r].worker, r == 2 ? 4 : -1, runs[r]); });
  }
  threads[2].join();  // rank 2 is gone; ranks 0 and 1 wait in step 4's all-reduce for it
  std::this_thread::sleep_for(100ms);
  const auto noticed = Clock::now();
  for (int r = 0; r < 2; ++r) channels[r].send(notice(r));
  threads.emplace_back([&] { runRank(store, 2, 1, replacementChannel.worker, -1, replacement); });
  for (auto& t : threads) {
    if (t.joinable()) t.join();
  }
  const auto took = Clock::now() - noticed;

  CHECK(runs[2].error == "");
  for (int r = 0; r < 2; ++r) {
    INFO("survivor " << r << ": " << runs[r].error);
    CHECK(runs[r].error == "");
    CHECK(runs[r].recoveries == 1);
    CHECK(runs[r].value == reference());
  }
  INFO("replacement: " << replacement.error);
  CHECK(replacement.error == "");
  CHECK(replacement.value == reference());
  CHECK(took < kSafetyBound);
}
