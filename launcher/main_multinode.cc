// ddprun-multinode: ddprun with the gRPC rendezvous linked in. ddprun execs it for multi-node jobs
// with the same arguments; it is not meant to be started by hand, but it works if it is.
#include "launcher/launch.h"
#include "launcher/multinode.h"

int main(int argc, char** argv) { return ddprun::launcherMain(argc, argv, ddprun::startMultiNode); }
