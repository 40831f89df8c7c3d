// A worker for the rendezvous teardown test: every rank but the last blocks in a store wait on keys
// nobody sets (as a rank blocked in a collective's bootstrap would); the last rank gives the others
// time to reach the server, then exits 3. The job ends while their waits are pending.
#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <thread>

#include "worker_sdk/ddp.h"

int main() {
  try {
    ddp::Env env = ddp::Env::fromEnviron();
    auto store = ddp::makeStore(env, std::chrono::minutes(2));
    if (env.rank == env.worldSize - 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      std::fprintf(stderr, "rank %d exits 3 while the others wait\n", env.rank);
      return 3;
    }
    std::printf("rank %d waits\n", env.rank);
    std::fflush(stdout);
    store->wait({"never-a", "never-b", "never-" + std::to_string(env.rank)});
    std::printf("rank %d: the keys came (unexpected)\n", env.rank);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank's store wait ended: %s\n", e.what());
    return 1;
  }
}
