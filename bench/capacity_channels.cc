#include "capacity_channels.h"

#include <arpa/inet.h>
#include <grpcpp/create_channel_posix.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace capacity {

namespace {

// TLS with `ca` as the one root (the daemon's --tls_cert chains to it), or plaintext without one.
std::shared_ptr<grpc::ChannelCredentials> credentials(const std::string& ca) {
  if (ca.empty()) return grpc::InsecureChannelCredentials();
  std::ifstream f(ca);
  std::stringstream pem;
  pem << f.rdbuf();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = pem.str();
  return grpc::SslCredentials(ssl);
}

std::string target(const std::string& address) {
  // An IP literal skips the DNS resolver (and its work per channel); a name goes through it.
  if (!address.empty() && address[0] >= '0' && address[0] <= '9') return "ipv4:" + address;
  return address;
}

// A socket connected to address from sourceAddressOf(index), or -1.
int connectFrom(long index, const std::string& address) {
  const auto colon = address.rfind(':');
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(std::atoi(address.substr(colon + 1).c_str())));
  if (colon == std::string::npos || ::inet_pton(AF_INET, address.substr(0, colon).c_str(), &to.sin_addr) != 1) return -1;
  sockaddr_in from{};
  from.sin_family = AF_INET;
  if (::inet_pton(AF_INET, sourceAddressOf(index).c_str(), &from.sin_addr) != 1) return -1;
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from) != 0 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

std::string sourceAddressOf(long index) {
  const uint32_t v = static_cast<uint32_t>(index) + 2;
  return "127." + std::to_string((v >> 16) & 255) + "." + std::to_string((v >> 8) & 255) + "." + std::to_string(v & 255);
}

std::shared_ptr<grpc::Channel> agentChannel(const AgentChannelSettings& o, long index) {
  // As ddprun's agent (rendezvous/client/grpc_rendezvous.cc), plus a subchannel pool of its own: a
  // connection per agent, as separate processes have.
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(4 << 20);
  args.SetMaxSendMessageSize(4 << 20);
  if (o.keepalive) {
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, static_cast<int>(std::max<uint32_t>(o.heartbeatTimeoutMs / 2, 100)));
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, static_cast<int>(std::max<uint32_t>(o.heartbeatTimeoutMs, 100)));
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  }
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  if (o.distinctSources) {
    // Connected here and handed over: such a channel does not reconnect, which a benchmark run
    // does not need.
    const int fd = connectFrom(index, o.address);
    if (fd < 0) return nullptr;
    return grpc::CreateCustomInsecureChannelFromFd(target(o.address), fd, args);
  }
  return grpc::CreateCustomChannel(target(o.address), credentials(o.tlsCa), args);
}

std::shared_ptr<grpc::Channel> storeChannel(const std::string& address, const std::string& tlsCa) {
  // As ddprun's store client (rpc/grpc_util.cc makeChannel), one connection per worker.
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(80 << 20);
  args.SetMaxSendMessageSize(80 << 20);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(target(address), credentials(tlsCa), args);
}

int connectAll(const std::vector<std::shared_ptr<grpc::Channel>>& channels, int window,
               std::chrono::steady_clock::time_point deadline) {
  grpc::CompletionQueue cq;
  const int n = static_cast<int>(channels.size());
  const auto until = std::chrono::system_clock::now() +
                     std::chrono::duration_cast<std::chrono::system_clock::duration>(deadline - std::chrono::steady_clock::now());
  int next = 0, ready = 0, failed = 0, inflight = 0;
  auto watch = [&](int i, grpc_connectivity_state last) {
    channels[static_cast<size_t>(i)]->NotifyOnStateChange(last, until, &cq, reinterpret_cast<void*>(static_cast<intptr_t>(i)));
  };
  while (ready + failed < n) {
    while (next < n && inflight < window) {
      const int i = next++;
      auto state = channels[static_cast<size_t>(i)]->GetState(true);
      if (state == GRPC_CHANNEL_READY) {
        ++ready;
      } else {
        ++inflight;
        watch(i, state);
      }
    }
    if (inflight == 0) continue;
    void* tag = nullptr;
    bool ok = false;
    if (!cq.Next(&tag, &ok)) break;
    const int i = static_cast<int>(reinterpret_cast<intptr_t>(tag));
    if (!ok) {  // the deadline passed
      ++failed;
      --inflight;
      continue;
    }
    auto state = channels[static_cast<size_t>(i)]->GetState(true);
    if (state == GRPC_CHANNEL_READY) {
      ++ready;
      --inflight;
    } else {
      watch(i, state);
    }
  }
  cq.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) {
  }
  return ready;
}

}  // namespace capacity
