#include "rendezvous/rendezvous_server.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netdb.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "common/error.h"
#include "common/strings.h"
#include "common/unique_fd.h"
#include "rendezvous/grpc_runtime.h"
#include "store/grpc_util.h"
#include "rendezvous/rendezvous_service.h"
#include "store/store_service.h"

namespace ddprun {
namespace {

// gRPC binds with SO_REUSEPORT and reports failures vaguely; a plain bind first gives the real
// reason (in use, not an address of this machine) with the address in the message.
void probeBind(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* results = nullptr;
  std::string service = std::to_string(port);
  int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &results);
  if (rc != 0) throw ConnectionError("cannot resolve '" + host + "': " + ::gai_strerror(rc));
  std::string error;
  for (addrinfo* ai = results; ai; ai = ai->ai_next) {
    UniqueFd sock(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!sock) continue;
    int one = 1;
    ::setsockopt(sock.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(sock.get(), ai->ai_addr, ai->ai_addrlen) == 0) {
      ::freeaddrinfo(results);
      return;
    }
    error = std::strerror(errno);
  }
  ::freeaddrinfo(results);
  throw ConnectionError("cannot listen on " + joinHostPort(host, port) + ": " + error);
}

int clampedMs(std::chrono::milliseconds d) {
  return static_cast<int>(std::clamp<int64_t>(d.count(), 1, std::numeric_limits<int>::max()));
}

}  // namespace

class RendezvousServer::Impl {
 public:
  explicit Impl(RendezvousServerOptions options) : options_(std::move(options)) {
    prepareGrpcRuntime();
    if (options_.port != 0) probeBind(options_.bindAddress, options_.port);
    rendezvous_ = std::make_unique<RendezvousService>(RendezvousServiceOptions{
        options_.token,
        [this](const std::string& runId, uint64_t round) { store_->store().dropRoundsBefore(runId, round); },
        [this](const std::string& runId) { store_->store().dropRun(runId); },
        options_.jobIdleTimeout, options_.requireHostMatch});
    store_ = std::make_unique<StoreService>(StoreServiceOptions{
        options_.token,
        [this](const std::string& runId, uint64_t round) { return rendezvous_->roundIsCurrent(runId, round); }},
        options_.storeLimits);
    grpc::ServerBuilder builder;
    builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);  // a second server on the port must fail
    if (options_.handshakeTimeout.count() > 0) {
      builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, clampedMs(options_.handshakeTimeout));
    }
    if (options_.idleTimeout.count() > 0) {
      builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, clampedMs(options_.idleTimeout));
    }
    if (options_.keepalive.count() > 0) {
      builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, clampedMs(options_.keepalive));
      builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                                 clampedMs(std::min<std::chrono::milliseconds>(options_.keepalive, std::chrono::seconds(20))));
    }
    applyServerDefaults(builder);
    builder.AddListeningPort(joinHostPort(options_.bindAddress, options_.port), grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(rendezvous_.get());
    builder.RegisterService(store_.get());
    server_ = builder.BuildAndStart();
    if (!server_ || port_ == 0) {
      throw ConnectionError("cannot listen on " + joinHostPort(options_.bindAddress, options_.port));
    }
    if (options_.token.empty() && !isLoopback(options_.bindAddress)) {
      spdlog::warn("rendezvous on {} has NO job token: anyone who reaches this address can join or disturb jobs "
                   "(set DDPRUN_RDZV_TOKEN or --rdzv_conf token_file=PATH)",
                   address());
    }
  }

  ~Impl() { shutdown(std::chrono::milliseconds(0)); }

  void shutdown(std::chrono::milliseconds grace) {
    if (!server_) return;
    rendezvous_->waitIdle(grace);
    rendezvous_->shutdown();
    store_->shutdown();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    server_->Wait();
    server_.reset();
  }

  int port() const { return port_; }
  std::string address() const { return joinHostPort(options_.bindAddress, port_); }

 private:
  static bool isLoopback(const std::string& host) {
    return host == "localhost" || startsWith(host, "127.") || host == "::1";
  }

  RendezvousServerOptions options_;
  std::unique_ptr<RendezvousService> rendezvous_;
  std::unique_ptr<StoreService> store_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

void raiseOpenFileLimitForServing() {
  constexpr rlim_t kEnough = 4096;
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  if (limit.rlim_cur < kEnough) {
    spdlog::warn("the rendezvous server can keep only about {} connections open (open file limit {}; each agent "
                 "and each store client holds one): raise the hard limit (ulimit -Hn, LimitNOFILE=) for large jobs",
                 limit.rlim_cur > 64 ? limit.rlim_cur - 64 : 0, limit.rlim_cur);
  }
}

RendezvousServer::RendezvousServer(RendezvousServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}
RendezvousServer::~RendezvousServer() = default;
int RendezvousServer::port() const { return impl_->port(); }
std::string RendezvousServer::address() const { return impl_->address(); }
void RendezvousServer::shutdown(std::chrono::milliseconds grace) { impl_->shutdown(grace); }

}  // namespace ddprun
