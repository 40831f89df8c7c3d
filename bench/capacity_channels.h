// The load generator's connections (bench/rdzv_capacity.cc): one per simulated agent or worker,
// each with the channel settings of ddprun's own clients.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace capacity {

struct AgentChannelSettings {
  std::string address;                // the daemon, host:port
  uint32_t heartbeatTimeoutMs = 5000;  // keepalive as the agents set it from this
  bool keepalive = true;
  // Agent i connects from its own loopback address, sourceAddressOf(i) (all of 127/8 is loopback
  // on Linux), as agents on as many hosts do; the guard's per-address limits then see one agent
  // per address. Such a channel is made from a connected socket: it does not reconnect, and it has
  // no connectivity state to watch (do not pass it to connectAll).
  bool distinctSources = false;
  // TLS (the daemon's --tls_cert): the CA to trust; empty: plaintext. Not with distinctSources
  // (gRPC makes a channel from a connected socket only without TLS).
  std::string tlsCa;
};

// 127.0.0.2 onwards.
std::string sourceAddressOf(long index);
// As ddprun's agent's channel (rendezvous/client/grpc_rendezvous.cc), on a connection of its own;
// null when --distinct_sources could not connect.
std::shared_ptr<grpc::Channel> agentChannel(const AgentChannelSettings& settings, long index);
// As ddprun's store client's channel (rpc/grpc_util.cc makeChannel), on a connection of its own.
std::shared_ptr<grpc::Channel> storeChannel(const std::string& address, const std::string& tlsCa = "");
// Brings every channel to READY, at most `window` connecting at once. Returns how many did
// before `deadline`.
int connectAll(const std::vector<std::shared_ptr<grpc::Channel>>& channels, int window,
               std::chrono::steady_clock::time_point deadline);

}  // namespace capacity
