// libddp, ddprun's worker SDK, in one include: the job's environment, its store, communicators
// (gloo on CPU, NCCL on GPU), the gradient reducer, the heartbeat to the agent and in-process
// recovery (runRecoverable).
#pragma once

#include "worker_sdk/communicator.h"
#include "worker_sdk/data_type.h"
#include "worker_sdk/env.h"
#include "worker_sdk/gradient_reducer.h"
#include "worker_sdk/heartbeat.h"
#include "worker_sdk/in_process_store.h"
#include "worker_sdk/prefix_store.h"
#include "worker_sdk/recovery.h"
#include "worker_sdk/recovery_notice.h"
#include "worker_sdk/remote_store.h"
#include "worker_sdk/staging_buffer.h"
#include "worker_sdk/store.h"
#include "worker_sdk/version.h"
#include "worker_sdk/work.h"
