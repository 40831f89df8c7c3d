#include "rendezvous/server/rendezvous_server.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <malloc.h>
#include <netdb.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <thread>

#include "common/error.h"
#include "common/strings.h"
#include "common/unique_fd.h"
#include "netguard/connection_listener.h"
#include "rpc/grpc_runtime.h"
#include "rpc/grpc_util.h"
#include "rendezvous/server/daemon_metrics.h"
#include "rendezvous/server/rendezvous_service.h"
#include "store/grpc/store_service.h"
#include "store/wire/store_wire.h"
#include "store/wire/store_wire_server.h"

namespace ddprun {
namespace {

int clampedMs(std::chrono::milliseconds d) {
  return static_cast<int>(std::clamp<int64_t>(d.count(), 1, std::numeric_limits<int>::max()));
}

}  // namespace

class RendezvousServer::Impl {
 public:
  explicit Impl(RendezvousServerOptions options) : options_(std::move(options)) {
    prepareGrpcRuntime();
    // Our own accept loop (see connection_listener.h): binds now, so that a port in use fails here
    // with the address in the message.
    ConnectionListenerOptions listen;
    listen.host = options_.bindAddress;
    listen.port = options_.port;
    listen.maxConnections = options_.maxConnections;
    listen.reserveFds = options_.reserveFds;
    if (options_.handshakeTimeout.count() > 0) listen.handshakeTimeout = options_.handshakeTimeout;
    listen.abuse = options_.abuse;
    listen.tokenRequired = !options_.token.empty();
    listen.token = options_.token;
    listen.tokenMetadataKey = kTokenMetadataKey;
    // Every connection is relayed: without the relay's frame limits, and the penalty of an address
    // that broke them, gRPC 1.51 grows without bound under rapid reset, whoever sends it (a buggy
    // client on a trusted network too). Off turns off only the gate for strangers: connections are
    // trusted at once instead of when they show the token (docs/rendezvous.md, "The guard is on
    // by default").
    listen.relay = true;
    listen.gate = options_.guard != RendezvousServerOptions::Guard::kOff;
    listen.tls = options_.tls;
    // The workers' store in its own framing, on the same port (store/wire/store_wire.h); plaintext only.
    if (!options_.tls) {
      listen.sideProtocol.magic = std::string(storewire::kMagic);
      listen.sideProtocol.accept = [this](UniqueFd fd, const std::string& address) {
        storeWire_->adopt(std::move(fd), address);
      };
    }
    listener_ = std::make_unique<ConnectionListener>(listen);
    spdlog::debug("rendezvous: connection guard {} (relaying connections through a frame counter{})",
                  listen.gate ? "on" : "off", listen.gate ? "" : "; every connection trusted at once");
    port_ = listener_->port();
    RendezvousServiceOptions service;
    service.token = options_.token;
    service.onStoreDrops = [this](const std::string& runId, const StoreDrops& drops) {
      if (drops.run) {
        storeCore_->store().dropRun(runId);
      } else {
        storeCore_->store().dropRoundsBefore(runId, drops.roundsBelow);
      }
    };
    service.onJobGone = [this](const std::string& runId) {
      storeCore_->store().dropRun(runId);
      if (metrics_) metrics_->onJobGone(runId);
    };
    // metrics_ is set before the listener starts, so before any call can make an event.
    service.onEvents = [this](const std::string& runId, const std::vector<JobEvent>& events) {
      if (metrics_) metrics_->onEvents(runId, events);
    };
    service.onHeartbeatGap = [this](Micros gap) {
      if (metrics_) metrics_->onHeartbeatGap(gap);
    };
    service.jobIdleTimeout = options_.jobIdleTimeout;
    service.requireHostMatch = options_.requireHostMatch;
    service.peerAddress = [this](const std::string& grpcPeer) { return listener_->peerAddress(grpcPeer); };
    service.admitCall = [this](const std::string& grpcPeer, bool authenticated) {
      return listener_->admitCall(grpcPeer, authenticated);
    };
    service.serverName = options_.serverName;
    rendezvous_ = std::make_unique<RendezvousService>(std::move(service));
    StoreCoreOptions core;
    core.token = options_.token;
    core.roundIsCurrent = [this](const std::string& runId, uint64_t round) {
      return rendezvous_->roundIsCurrent(runId, round);
    };
    core.jobExists = [this](const std::string& runId) { return rendezvous_->jobExists(runId); };
    core.limits = options_.storeLimits;
    storeCore_ = std::make_unique<StoreCore>(std::move(core));
    StoreServiceOptions grpcStore;
    grpcStore.admitCall = [this](const std::string& grpcPeer, bool authenticated) {
      return listener_->admitCall(grpcPeer, authenticated);
    };
    store_ = std::make_unique<StoreService>(*storeCore_, std::move(grpcStore));
    StoreWireServerOptions wire;
    if (options_.handshakeTimeout.count() > 0) wire.helloTimeout = options_.handshakeTimeout;
    wire.onAbuse = [this](const std::string& address, const std::string& why) { listener_->penalize(address, why); };
    storeWire_ = std::make_unique<StoreWireServer>(*storeCore_, std::move(wire));
    grpc::ServerBuilder builder;
    if (options_.idleTimeout.count() > 0) {
      builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, clampedMs(options_.idleTimeout));
    }
    if (options_.keepalive.count() > 0) {
      builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, clampedMs(options_.keepalive));
      builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                                 clampedMs(std::min<std::chrono::milliseconds>(options_.keepalive, std::chrono::seconds(20))));
    }
    if (options_.maxStreamsPerConnection > 0) {
      builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options_.maxStreamsPerConnection);
    }
    if (options_.memoryQuotaBytes > 0) {
      quota_.Resize(options_.memoryQuotaBytes);
      builder.SetResourceQuota(quota_);
    }
    applyServerDefaults(builder);
    builder.RegisterService(rendezvous_.get());
    builder.RegisterService(store_.get());
    server_ = builder.BuildAndStart();
    if (!server_) throw ConnectionError("cannot start the rendezvous server on " + address());
    if (options_.metrics.port >= 0) {
      metrics_ = std::make_unique<DaemonMetrics>(options_.metrics, [this] { return gauges(); }, [this] { return ready_.load(); });
      spdlog::info("rendezvous: metrics and probes on http://{}/metrics", metrics_->address());
    }
    listener_->start(server_.get());
    ready_ = true;
    if (options_.trimInterval.count() > 0) trimmer_ = std::thread([this] { trimLoop(); });
    if (options_.token.empty() && !isLoopback(options_.bindAddress)) {
      spdlog::warn("rendezvous on {} has NO job token: anyone who reaches this address can join or disturb jobs "
                   "(set DDPRUN_RDZV_TOKEN or --rdzv_conf token_file=PATH)",
                   address());
    }
  }

  ~Impl() { shutdown(std::chrono::milliseconds(0)); }

  void shutdown(std::chrono::milliseconds grace) {
    if (trimmer_.joinable()) {
      {
        std::lock_guard<std::mutex> lock(trimMutex_);
        stopping_ = true;
      }
      trimCv_.notify_all();
      trimmer_.join();
    }
    ready_ = false;
    if (!server_) return;
    rendezvous_->waitIdle(grace);
    listener_->stop();
    rendezvous_->shutdown();
    storeCore_->shutdown();  // pending waits end first, whichever adapter holds them
    store_->shutdown();
    storeWire_->stop();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    server_->Wait();
    server_.reset();
  }

  int port() const { return port_; }
  std::string metricsAddress() const { return metrics_ ? metrics_->address() : std::string(); }
  uint64_t timerWakeups() const { return rendezvous_->timerWakeups(); }
  ConnectionListenerStats connectionStats() const { return listener_->stats(); }
  std::string address() const { return joinHostPort(options_.bindAddress, port_); }

 private:
  DaemonGauges gauges() const {
    DaemonGauges g;
    g.jobs = rendezvous_->jobCount();
    g.perJob = rendezvous_->jobGauges(DaemonMetrics::kMaxJobSeries);
    g.connections = listener_->stats();
    g.store = storeCore_->store().stats();
    g.storeWire = storeWire_->stats();
    g.timerWakeups = rendezvous_->timerWakeups();
    return g;
  }

  static bool isLoopback(const std::string& host) {
    return host == "localhost" || startsWith(host, "127.") || host == "::1";
  }

  // glibc keeps freed memory in its heaps (one per thread that allocated) and returns only a
  // heap's free top; after 300,000 calls of an attack were freed the daemon still held 9 GB.
  // malloc_trim walks every heap and returns its free pages: milliseconds, every few seconds.
  void trimLoop() {
    std::unique_lock<std::mutex> lock(trimMutex_);
    while (!trimCv_.wait_for(lock, options_.trimInterval, [this] { return stopping_; })) {
      ::malloc_trim(0);
    }
  }

  RendezvousServerOptions options_;
  grpc::ResourceQuota quota_{"ddprun-rdzv"};
  std::thread trimmer_;
  std::mutex trimMutex_;
  std::condition_variable trimCv_;
  bool stopping_ = false;
  std::unique_ptr<RendezvousService> rendezvous_;
  std::unique_ptr<StoreCore> storeCore_;  // the adapters below go first
  std::unique_ptr<StoreService> store_;
  std::unique_ptr<StoreWireServer> storeWire_;
  std::unique_ptr<ConnectionListener> listener_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::atomic<bool> ready_{false};  // /readyz: serving, not shutting down
  std::unique_ptr<DaemonMetrics> metrics_;  // last: stops serving before what its gauges read goes
};

RendezvousServerOptions::Guard parseGuard(const std::string& value, const std::string& what) {
  if (value == "on" || value == "auto") return RendezvousServerOptions::Guard::kOn;  // auto: kept, as on
  if (value == "off") return RendezvousServerOptions::Guard::kOff;
  throw ConfigError(what + " must be auto, on or off, not '" + printable(value, 64) + "'");
}

RendezvousServerOptions::Guard guardFromEnvironment() {
  const char* value = std::getenv("DDPRUN_RDZV_GUARD");
  return value ? parseGuard(value, "DDPRUN_RDZV_GUARD") : RendezvousServerOptions::Guard::kOn;
}

void raiseOpenFileLimitForServing(std::size_t reserveFds, bool guard) {
  constexpr rlim_t kEnough = 4096;
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  if (limit.rlim_cur < kEnough) {
    // What the listener's cap allows: the limit less the reserve, over the descriptors one
    // connection holds (the guard's pair too).
    const std::size_t perConnection = guard ? 3 : 1;
    const std::size_t usable = limit.rlim_cur > reserveFds ? limit.rlim_cur - reserveFds : 0;
    spdlog::warn("the rendezvous server can keep at most {} connections open (open-file limit {} less {} in "
                 "reserve, {} descriptor(s) per connection{}; each agent and each store client holds one): raise the "
                 "hard limit (ulimit -Hn, LimitNOFILE=) for large jobs",
                 usable / perConnection, limit.rlim_cur, reserveFds, perConnection, guard ? " with the connection guard" : "");
  }
}

RendezvousServer::RendezvousServer(RendezvousServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}
RendezvousServer::~RendezvousServer() = default;
int RendezvousServer::port() const { return impl_->port(); }
std::string RendezvousServer::address() const { return impl_->address(); }
void RendezvousServer::shutdown(std::chrono::milliseconds grace) { impl_->shutdown(grace); }
std::string RendezvousServer::metricsAddress() const { return impl_->metricsAddress(); }
uint64_t RendezvousServer::timerWakeups() const { return impl_->timerWakeups(); }
ConnectionListenerStats RendezvousServer::connectionStats() const { return impl_->connectionStats(); }

}  // namespace ddprun
