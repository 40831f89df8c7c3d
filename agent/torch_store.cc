#include "agent/torch_store.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>

#include "agent/proc_tree.h"
#include "agent/socket_peer.h"
#include "common/error.h"
#include "common/log_limiter.h"
#include "common/unique_fd.h"
#include "store/core/store_core.h"
#include "store/core/store_request_handler.h"

namespace ddprun {

namespace {

// The job's processes on this node: the workers and everything below them (a data loader's
// worker may open its own store connection).
std::vector<pid_t> jobProcesses(const std::vector<pid_t>& workers) {
  std::vector<pid_t> out = workers;
  std::optional<std::vector<proc::ProcessInfo>> table;
  for (pid_t worker : workers) {
    auto below = proc::liveDescendantsOf(worker);
    if (!below) {
      if (!table) table = proc::listProcesses();
      below = proc::liveDescendants(worker, *table);
    }
    out.insert(out.end(), below->begin(), below->end());
  }
  return out;
}

UniqueFd listenLoopback(int port, int* boundPort) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) throw Error(std::string("torch store: socket: ") + std::strerror(errno));
  const int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    throw ConfigError("cannot serve torch's store at " + std::string(TorchStore::kAddress) + ":" +
                      std::to_string(port) + ": " + std::strerror(errno) +
                      (errno == EADDRINUSE ? " (choose another --master_port)" : ""));
  }
  if (::listen(fd.get(), 1024) != 0) throw Error(std::string("torch store: listen: ") + std::strerror(errno));
  socklen_t len = sizeof addr;
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  *boundPort = ntohs(addr.sin_port);
  return fd;
}

}  // namespace

class TorchStore::Impl {
 public:
  Impl(TorchStoreOptions options, UniqueFd listener)
      : options_(std::move(options)), listener_(std::move(listener)), wake_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    if (!options_.peers) options_.peers = std::make_shared<ProcSocketPeerFinder>();
    acceptor_ = std::thread([this] { acceptLoop(); });
  }

  // The server and (one node) the core, made at the first connection on the acceptor's thread: a
  // launch, and a job whose ranks never use torch's store, pay for the listening socket only.
  void ensureServer() {
    if (server_) return;  // set on this thread only
    std::unique_ptr<StoreCore> core;
    if (!options_.sinksFor) {
      // One node: the keys live here. Only the current round may use them.
      StoreCoreOptions coreOptions;
      coreOptions.roundIsCurrent = [this](const std::string&, uint64_t round) { return round == currentRound_.load(); };
      core = std::make_unique<StoreCore>(std::move(coreOptions));
    }
    TcpStoreServerOptions server;
    server.maxConnections = options_.maxConnections;
    server.bind = [this](const TcpStoreConnectionInfo& info) { return bind(info); };
    server.makeSink = [this](StoreRequestSink::Respond respond) -> std::shared_ptr<StoreRequestSink> {
      StoreRequestSink::Factory sinks;
      {
        std::lock_guard lock(mu_);
        sinks = sinks_;
      }
      if (sinks) return sinks(std::move(respond));
      return std::make_shared<StoreRequestHandler>(*core_, std::move(respond));
    };
    std::lock_guard lock(lazyMu_);
    core_ = std::move(core);
    server_ = std::make_unique<TcpStoreServer>(std::move(server));
  }

  ~Impl() { stop(); }

  void beginRound(const std::string& runId, const RoundInfo& round) {
    StoreRequestSink::Factory sinks;
    if (options_.sinksFor) sinks = options_.sinksFor(round);
    {
      std::lock_guard lock(mu_);
      scope_ = StoreScope{runId, round.round};
      workers_.clear();
      spawning_ = true;
      sinks_ = std::move(sinks);
    }
    currentRound_ = round.round;
    std::lock_guard lock(lazyMu_);
    if (core_) core_->store().dropRoundsBefore(runId, round.round);
  }

  void admit(std::vector<pid_t> workers) {
    {
      std::lock_guard lock(mu_);
      workers_ = std::move(workers);
      spawning_ = false;
    }
    admitted_.notify_all();
  }

  void stop() {
    if (stopped_.exchange(true)) return;
    const uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_.get(), &one, sizeof one);
    {
      std::lock_guard lock(mu_);
      spawning_ = false;
    }
    admitted_.notify_all();
    if (acceptor_.joinable()) acceptor_.join();
    // The acceptor, which alone makes them, has ended.
    if (server_) server_->stop();
    if (core_) core_->shutdown();
  }

  TcpStoreServerStats stats() const {
    std::lock_guard lock(lazyMu_);
    return server_ ? server_->stats() : TcpStoreServerStats{};
  }
  uint64_t refusedStrangers() const { return strangers_.load(); }

 private:
  void acceptLoop() {
    while (!stopped_.load()) {
      pollfd fds[2] = {{listener_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
      if (::poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        spdlog::error("torch store: poll: {}", std::strerror(errno));
        return;
      }
      if (fds[1].revents) return;
      // Drain the backlog; each connection is judged (bind) before the next is taken.
      for (int i = 0; i < 64; ++i) {
        UniqueFd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
        if (!fd) {
          if (errno == EMFILE || errno == ENFILE) {
            spdlog::warn("torch store: cannot accept a connection: {}", std::strerror(errno));
            std::this_thread::sleep_for(std::chrono::milliseconds(100));  // not a busy loop
          }
          break;
        }
        ensureServer();
        server_->adopt(std::move(fd));
      }
    }
  }

  // On the acceptor thread (TcpStoreServer::adopt): the round's scope for a process of the job.
  std::optional<StoreScope> bind(const TcpStoreConnectionInfo& info) {
    if (!info.loopback || info.fd < 0) return refuse(info, "not a loopback connection");
    StoreScope scope;
    std::vector<pid_t> workers;
    bool spawning = false;
    {
      std::unique_lock lock(mu_);
      admitted_.wait_for(lock, options_.spawnWait, [this] { return !spawning_; });
      scope = scope_;
      workers = workers_;
      spawning = spawning_;
    }
    if (workers.empty()) return refuse(info, spawning ? "the workers are still starting" : "no worker of the job runs");
    std::string why;
    const auto owner = options_.peers->ownerAmong(info.fd, jobProcesses(workers), &why);
    if (!owner) return refuse(info, why.empty() ? "no process of the job holds it" : why);
    return scope;
  }

  std::optional<StoreScope> refuse(const TcpStoreConnectionInfo& info, const std::string& why) {
    ++strangers_;
    if (auto held = log_.allow()) {
      spdlog::warn("torch store: refused a connection from {}: {} (only this node's workers of the job may use it){}",
                   info.address, why, heldBackNote(*held));
    }
    return std::nullopt;
  }

  TorchStoreOptions options_;
  UniqueFd listener_;
  UniqueFd wake_;
  mutable std::mutex lazyMu_;  // core_ and server_ are made on the acceptor's thread
  std::unique_ptr<StoreCore> core_;  // one node: the keys; destroyed after server_
  std::unique_ptr<TcpStoreServer> server_;
  std::thread acceptor_;
  std::atomic<bool> stopped_{false};
  std::atomic<uint64_t> currentRound_{0};
  std::atomic<uint64_t> strangers_{0};
  LogLimiter log_;

  std::mutex mu_;
  std::condition_variable admitted_;
  StoreScope scope_;
  std::vector<pid_t> workers_;
  bool spawning_ = false;
  StoreRequestSink::Factory sinks_;
};

TorchStore::TorchStore(TorchStoreOptions options) {
  UniqueFd listener = listenLoopback(options.port, &port_);
  impl_ = std::make_unique<Impl>(std::move(options), std::move(listener));
}

TorchStore::~TorchStore() { stop(); }
void TorchStore::beginRound(const std::string& runId, const RoundInfo& round) { impl_->beginRound(runId, round); }
void TorchStore::admit(std::vector<pid_t> workers) { impl_->admit(std::move(workers)); }
void TorchStore::stop() { impl_->stop(); }
TcpStoreServerStats TorchStore::stats() const { return impl_->stats(); }
uint64_t TorchStore::refusedStrangers() const { return impl_->refusedStrangers(); }

}  // namespace ddprun
