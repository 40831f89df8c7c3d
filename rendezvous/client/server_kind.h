// Which rendezvous a gRPC server serves, asked when it answered a call with UNIMPLEMENTED: the
// gRPC backend pointed at an etcd, or the etcd backend pointed at a ddprun-rdzv, must say so in
// one line and exit 2 at once (issue #37), not retry as if the rendezvous were lost.
#pragma once

#include <chrono>
#include <string>

#include "tls/tls_options.h"

namespace ddprun {

enum class ServerKind {
  kUnknown,  // neither answered (or both did not): some other gRPC server, or none
  kDdprun,   // serves ddprun.v1.Rendezvous: ddprun-rdzv, or an agent hosting the rendezvous
  kEtcd,     // serves etcd's v3 KV API
};

// Asks `endpoint` (HOST:PORT) once for each service, within `timeout` in all: a service is served
// when a call to it is answered with anything but UNIMPLEMENTED (a refusal of the token or of etcd's
// credentials counts: the service is there).
ServerKind identifyServer(const std::string& endpoint, const TlsClientOptions& tls, std::chrono::milliseconds timeout);

// One line for the gRPC backend that got UNIMPLEMENTED from `endpoint` (`detail`: gRPC's message).
std::string notADdprunRendezvous(const std::string& endpoint, ServerKind kind, const std::string& detail);
// One line for the etcd backend that got UNIMPLEMENTED from `endpoint`.
std::string notAnEtcd(const std::string& endpoint, ServerKind kind, const std::string& detail);

}  // namespace ddprun
