// ddprun-multinode: ddprun with the multi-node backends linked in (grpc, static, etcd: all of them
// speak gRPC, to a rendezvous server or to etcd). ddprun execs it for multi-node jobs
// with the same arguments; it is not meant to be started by hand, but it works if it is.
#include "common/build_info.h"
#include "launcher/backend/backend.h"
#include "launcher/launch.h"
#include "rpc/grpc_runtime.h"

int main(int argc, char** argv) {
  return ddprun::launcherMain(argc, argv, ddprun::startMultiNode, [] {
    auto links = ddprun::grpcLinks(DDPRUN_GRPC_COMPILED_IN);
    for (auto& link : ddprun::loggingLinks()) links.push_back(link);
    links.push_back(ddprun::boostLink());
    links.push_back(ddprun::cxxRuntimeLink());
    return ddprun::versionText("ddprun-multinode", links);
  });
}
