#include "rpc/grpc_util.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "tls/client.h"

namespace ddprun {

bool tokenAuthorized(const grpc::ServerContextBase& context, const std::string& token) {
  if (token.empty()) return true;
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kTokenMetadataKey);
  return it != metadata.end() && constantTimeEquals(std::string_view(it->second.data(), it->second.size()), token);
}

std::string_view callToken(const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kTokenMetadataKey);
  return it == metadata.end() ? std::string_view() : std::string_view(it->second.data(), it->second.size());
}

std::shared_ptr<grpc::Channel> makeChannel(const std::string& address, std::chrono::milliseconds keepalive,
                                           const TlsClientOptions& tls) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  // gRPC's own reconnect backoff starts at 1 s; keep it short so that the caller's jittered
  // backoff, not gRPC's, paces connection attempts. Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: despite
  // its name it is how long one connection attempt (TCP connect + HTTP/2 SETTINGS) may take, and
  // at 50 ms a burst of a hundred workers connecting to a busy server at once kept timing out
  // their own attempts until the caller's connect timeout (bench: store bootstrap of 128 ranks).
  // gRPC's default (20 s) stays; the caller's connect timeout bounds the whole wait.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  if (keepalive.count() > 0) {
    const int ms = static_cast<int>(std::min<int64_t>(keepalive.count(), std::numeric_limits<int>::max()));
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, ms);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, ms);
    args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);  // gRPC stops after 2 by default
  }
  return grpc::CreateCustomChannel(address, channelCredentials(tls), args);
}

void applyServerDefaults(grpc::ServerBuilder& builder) {
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  // Clients ping to find dead connections: agents every heartbeat_timeout / 2 (as often as every
  // 100 ms), store clients after their keepalive. gRPC would answer pings more often than every
  // 5 minutes with GOAWAY (too_many_pings) and cut the connection.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 50);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
}

grpc::Status bounded(const grpc::Status& status) {
  if (status.error_message().size() <= kMaxErrorMessageBytes) return status;
  return grpc::Status(status.error_code(), boundedErrorMessage(status.error_message()));
}

}  // namespace ddprun
