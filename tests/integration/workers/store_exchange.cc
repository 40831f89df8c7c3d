// A worker that agrees with its peers through the job's store (whatever DDPRUN_STORE_ADDR names):
// every rank adds 1 to "arrived", publishes its rank, waits for every rank's key, and races a
// compare_set for "leader". Prints "rank R: arrived=A leader=L keys=K"; exits 0, or 1 on an error.
// STORE_EXCHANGE_KEY_PREFIX: put before every key ("/" meets torch's TCPStore client, which sends
// its key K as "/K").
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <exception>
#include <string>
#include <vector>

#include "worker_sdk/ddp.h"

int main() {
  try {
    ddp::Env env = ddp::Env::fromEnviron();
    auto store = ddp::makeStore(env, std::chrono::minutes(1));
    const char* prefixVar = std::getenv("STORE_EXCHANGE_KEY_PREFIX");
    const std::string p = prefixVar ? prefixVar : "";
    store->add(p + "arrived", 1);
    store->set(p + "rank/" + std::to_string(env.rank), std::to_string(env.rank));
    std::vector<std::string> keys;
    for (int r = 0; r < env.worldSize; ++r) keys.push_back(p + "rank/" + std::to_string(r));
    store->wait(keys);
    std::string leader = store->compareSet(p + "leader", "", std::to_string(env.rank));
    // Everyone has arrived once every rank key exists: the count is final.
    int64_t arrived = store->add(p + "arrived", 0);
    std::printf("rank %d: arrived=%lld leader=%s\n", env.rank, static_cast<long long>(arrived), leader.c_str());
    std::fflush(stdout);
    // STORE_EXCHANGE_HOLD=path: stay until the file exists (the test kills the job meanwhile).
    if (const char* hold = std::getenv("STORE_EXCHANGE_HOLD")) {
      while (access(hold, F_OK) != 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "store exchange failed: %s\n", e.what());
    return 1;
  }
}
