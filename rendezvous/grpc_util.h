// Small gRPC helpers shared by ddprun's services and clients: the job token and message limits.
#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/server_builder.h>

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

// An insecure channel to `address` (host:port) with the message limits set.
std::shared_ptr<grpc::Channel> makeChannel(const std::string& address);

// Sets the message limits on a server under construction.
void applyMessageLimits(grpc::ServerBuilder& builder);

}  // namespace ddprun
