// ddprun: a drop-in replacement for torchrun. See README.md for the flags and exit statuses.
// Multi-node jobs are handed to ddprun-multinode (see launcherMain).
#include "launcher/launch.h"

int main(int argc, char** argv) { return ddprun::launcherMain(argc, argv, nullptr); }
