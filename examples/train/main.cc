// train: a real data-parallel trainer on libddp, ddprun's worker SDK. Run it under ddprun:
//   ddprun --standalone --nproc_per_node=4 build/bin/train --epochs 5
// Exit codes: 0 done, 1 a runtime failure (store, collective, checkpoint), 2 bad flags or a bad
// environment (including --backend nccl without a CUDA device), 3 the --crash_at_epoch test hook.
#include <chrono>
#include <cstdint>
#include <exception>
#include <iostream>
#include <string>

#include "common/error.h"
#include "examples/train/options.h"
#include "examples/train/trainer.h"
#include "worker_sdk/communicator.h"
#include "worker_sdk/env.h"
#include "worker_sdk/remote_store.h"

int main(int argc, char** argv) {
  train::Options options;
  ddp::Env env;
  try {
    options = train::parseOptions(argc, argv);
    if (options.help) {
      std::cout << train::usage();
      return 0;
    }
    env = ddp::Env::fromEnviron();
    if (options.batch % env.worldSize != 0) {
      throw std::invalid_argument("--batch " + std::to_string(options.batch) + " is not divisible by the world size " +
                                  std::to_string(env.worldSize) + ": every rank needs an equal share of each batch");
    }
    if (options.batch > options.samples) {
      throw std::invalid_argument("--batch " + std::to_string(options.batch) + " exceeds the " +
                                  std::to_string(options.samples) + " samples");
    }
  } catch (const std::exception& e) {
    std::cerr << "train: " << e.what() << "\n" << train::usage();
    return 2;
  }
  // Before joining the job: a machine without a GPU is a bad environment, not a crash. The model
  // stays on the host either way; nccl only moves the gradient buckets through the device.
  if (const std::string why = ddp::whyBackendUnusable(ddp::parseBackend(options.backend)); !why.empty()) {
    // One write: std::cerr is unbuffered, and ddprun stops the other ranks as soon as one fails.
    std::cerr << ("train: --backend " + options.backend + " " + why + "\n") << std::flush;
    return 2;
  }
  try {
    auto store = ddp::makeStore(env);
    ddp::CommunicatorOptions commOptions;
    commOptions.timeout = std::chrono::milliseconds(static_cast<int64_t>(options.timeoutS * 1000));
    commOptions.device = options.device;
    auto comm = ddp::makeCommunicator(ddp::parseBackend(options.backend), env, *store, commOptions);
    return train::runTraining(options, env, *comm, std::cout);
  } catch (const std::exception& e) {
    std::cerr << "train (rank " << env.rank << "): " << e.what() << std::endl;
    return 1;
  }
}
