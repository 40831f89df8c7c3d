// Small gRPC helpers shared by ddprun's services and clients: the job token, message limits,
// keepalive.
#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "common/error_message.h"  // kMaxErrorMessageBytes
#include "common/secrets.h"        // constantTimeEquals
#include "tls/tls_options.h"

namespace ddprun {

// Metadata key that carries the job token on every call.
inline constexpr const char* kTokenMetadataKey = "x-ddprun-token";

// Largest gRPC message either side accepts: a 64 MiB store value plus its key and framing. Set
// explicitly so that both sides agree whatever gRPC's default is (4 MiB on receive). The server
// (store and rendezvous on one port) accepts this much.
inline constexpr int kMaxMessageBytes = 80 * 1024 * 1024;  // = kMaxStoreMessageBytes (store_limits.h)

// Largest message on an agent's rendezvous channel: its messages are small (a Join, a round), so
// an agent never takes in more than gRPC's own default from a server.
inline constexpr int kMaxRendezvousMessageBytes = 4 * 1024 * 1024;

// What a call hears when its connection broke the server's call limits and is being closed.
inline constexpr const char* kConnectionClosedForAbuse =
    "connection closed: too many calls, or calls without a valid job token";

// `status` with its message cut to kMaxErrorMessageBytes (saying how much was cut). Every status
// a ddprun service sends goes through it: no error can echo unbounded input.
grpc::Status bounded(const grpc::Status& status);

// Whether a call carries the job token `token` (any call does when the server has none): the one
// token check of every ddprun service. Compared in constant time; the token is never logged.
bool tokenAuthorized(const grpc::ServerContextBase& context, const std::string& token);
// The token a call carries (empty when none), for a service that checks it itself.
std::string_view callToken(const grpc::ServerContextBase& context);

// A channel to `address` (host:port) with the message limits set, over TLS when `tls.enabled`
// (throws ConfigError naming an unreadable file). With a keepalive above zero the channel pings a
// connection that has carried nothing for that long and drops it when no answer comes within as
// long again, failing the calls on it.
std::shared_ptr<grpc::Channel> makeChannel(const std::string& address,
                                           std::chrono::milliseconds keepalive = std::chrono::milliseconds(0),
                                           const TlsClientOptions& tls = {});

// Sets the message limits and lets clients ping as often as ddprun's do, on a server under
// construction.
void applyServerDefaults(grpc::ServerBuilder& builder);

}  // namespace ddprun
