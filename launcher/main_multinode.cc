// ddprun-multinode: ddprun with the multi-node backends linked in (grpc, static, etcd: all of them
// speak gRPC, to a rendezvous server or to etcd). ddprun execs it for multi-node jobs
// with the same arguments; it is not meant to be started by hand, but it works if it is.
#include "launcher/launch.h"
#include "launcher/backend/backend.h"

int main(int argc, char** argv) { return ddprun::launcherMain(argc, argv, ddprun::startMultiNode); }
