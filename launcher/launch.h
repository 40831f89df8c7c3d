// Runs a validated LaunchConfig: the event loop, signals, the supervisor, the rendezvous and the
// agent. Returns ddprun's exit status.
#pragma once

#include "launcher/launch_config.h"

namespace ddprun {

int launch(const LaunchConfig& config);

// --dry_run: prints the rank map and each worker's environment to stdout; starts nothing.
int printDryRun(const LaunchConfig& config);

}  // namespace ddprun
