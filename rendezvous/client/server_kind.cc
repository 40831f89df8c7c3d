#include "rendezvous/client/server_kind.h"

#include <grpcpp/grpcpp.h>

#include "common/error.h"
#include "ddprun/v1/rendezvous.grpc.pb.h"
#include "etcd/rpc.grpc.pb.h"
#include "rpc/grpc_util.h"

namespace ddprun {
namespace {

// Whether a call's status shows that the server has the service: it answered, and not with
// "unknown service"; no answer at all (UNAVAILABLE, a deadline) tells nothing.
bool served(const grpc::Status& s) {
  switch (s.error_code()) {
    case grpc::StatusCode::UNIMPLEMENTED:
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::UNKNOWN:
      return false;
    default:
      return true;
  }
}

std::string unimplemented(const std::string& detail) {
  return detail.empty() ? "UNIMPLEMENTED" : detail;
}

}  // namespace

ServerKind identifyServer(const std::string& endpoint, const TlsClientOptions& tls, std::chrono::milliseconds timeout) {
  std::shared_ptr<grpc::Channel> channel;
  try {
    channel = makeChannel(endpoint, std::chrono::milliseconds(0), tls);
  } catch (const Error&) {
    return ServerKind::kUnknown;  // an unreadable file: the caller's own error says more
  }
  const auto deadline = std::chrono::system_clock::now() + timeout / 2;
  {
    grpc::ClientContext context;
    context.set_deadline(deadline);
    ddprun::v1::StatusRequest request;
    request.set_max_nodes(1);
    ddprun::v1::StatusReply reply;
    if (served(ddprun::v1::Rendezvous::NewStub(channel)->Status(&context, request, &reply))) return ServerKind::kDdprun;
  }
  grpc::ClientContext context;
  context.set_deadline(deadline + timeout / 2);
  etcdserverpb::RangeRequest request;
  request.set_key("ddprun-probe");  // read only; an etcd with auth refuses it, which still tells
  request.set_count_only(true);
  etcdserverpb::RangeResponse reply;
  if (served(etcdserverpb::KV::NewStub(channel)->Range(&context, request, &reply))) return ServerKind::kEtcd;
  return ServerKind::kUnknown;
}

std::string notADdprunRendezvous(const std::string& endpoint, ServerKind kind, const std::string& detail) {
  const std::string head = "the server at " + endpoint + " is not a ddprun rendezvous";
  if (kind == ServerKind::kEtcd) {
    return head + ": it is an etcd (use --rdzv_backend=etcd for it, or point --rdzv_endpoint at a ddprun-rdzv)";
  }
  return head + " (" + unimplemented(detail) + "): point --rdzv_endpoint at a ddprun-rdzv or at the agent that hosts "
         "the rendezvous";
}

std::string notAnEtcd(const std::string& endpoint, ServerKind kind, const std::string& detail) {
  const std::string head = "the server at " + endpoint + " is not an etcd";
  if (kind == ServerKind::kDdprun) {
    return head + ": it is a ddprun rendezvous (ddprun-rdzv, or an agent hosting one); use --rdzv_backend=grpc for it";
  }
  return head + " (" + unimplemented(detail) + "): point --rdzv_endpoint at etcd's client port (2379 by default)";
}

}  // namespace ddprun
