// Data-parallel training of the MLP on the worker SDK: the data set sharded by rank as
// DistributedSampler does, gradients averaged by a GradientReducer (on gloo, or on nccl through
// device staging buffers while the model stays in host memory), a heartbeat every step, the
// global mean loss per epoch (an all-reduce), and a checkpoint after every epoch (rank 0 writes,
// every rank resumes from it).
#pragma once

#include <ostream>

#include "examples/train/options.h"
#include "worker_sdk/communicator.h"
#include "worker_sdk/env.h"

namespace train {

// Runs the training; rank 0 reports on `out`. Returns the process exit code.
int runTraining(const Options& options, const ddp::Env& env, ddp::Communicator& comm, std::ostream& out);

}  // namespace train
