// Small gRPC helpers shared by ddprun's services and clients: the job token, message limits,
// keepalive.
#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/server_builder.h>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

namespace ddprun {

// Metadata key that carries the job token on every call.
inline constexpr const char* kTokenMetadataKey = "x-ddprun-token";

// Largest gRPC message either side accepts: a 64 MiB store value plus its key and framing. Set
// explicitly so that both sides agree whatever gRPC's default is (4 MiB on receive).
inline constexpr int kMaxMessageBytes = 80 * 1024 * 1024;

// Compares two secrets in time that depends only on their lengths, not on where they differ.
bool constantTimeEquals(std::string_view a, std::string_view b);

// An insecure channel to `address` (host:port) with the message limits set. With a keepalive
// above zero the channel pings a connection that has carried nothing for that long and drops it
// when no answer comes within as long again, failing the calls on it.
std::shared_ptr<grpc::Channel> makeChannel(const std::string& address,
                                           std::chrono::milliseconds keepalive = std::chrono::milliseconds(0));

// Sets the message limits and lets clients ping as often as ddprun's do, on a server under
// construction.
void applyServerDefaults(grpc::ServerBuilder& builder);

}  // namespace ddprun
