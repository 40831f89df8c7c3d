#include "rendezvous/grpc_util.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <algorithm>

namespace ddprun {

bool constantTimeEquals(std::string_view a, std::string_view b) {
  // Visit every byte of the longer input whatever the contents, so timing does not reveal the
  // length of a matching prefix. volatile keeps the compiler from adding an early exit.
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  const std::size_t n = std::max(a.size(), b.size());
  for (std::size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = diff | static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

std::shared_ptr<grpc::Channel> makeChannel(const std::string& address) {
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
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

void applyMessageLimits(grpc::ServerBuilder& builder) {
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
}

}  // namespace ddprun
