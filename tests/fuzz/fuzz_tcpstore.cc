// Fuzz target: torch's TCPStore protocol as a client could send it (store/tcpstore/). The input is
// the whole byte stream of one connection; it goes to a real TcpStoreServer (its epoll thread, the
// StoreRequestHandler, a real StoreCore) through a socket pair, the client's side is then
// half-closed, and everything the server sends back is read.
//
// Properties:
// - the server closes the connection by itself once the client's side ended (as torch's does,
//   forgetting its waits), within 10 s whatever the bytes;
// - once closed, the connection is gone from the server and no wait of it is left in the store;
// - the server survives (no crash, no sanitizer report) whatever the bytes.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include <spdlog/spdlog.h>

#include "common/unique_fd.h"
#include "store/core/store_core.h"
#include "store/tcpstore/tcpstore_server.h"

namespace {

[[noreturn]] void violated(const char* what) {
  std::fprintf(stderr, "fuzz_tcpstore: property violated: %s\n", what);
  std::abort();
}

struct Server {
  Server() {
    spdlog::set_level(spdlog::level::off);
    ddprun::RunScopedStoreOptions limits;
    limits.maxBytesPerRun = 1 << 20;
    core = std::make_unique<ddprun::StoreCore>(ddprun::StoreCoreOptions{
        .token = "", .roundIsCurrent = nullptr, .jobExists = nullptr, .maxPendingPerConnection = 1024, .limits = limits,
        .driveDeadlines = true});
    ddprun::TcpStoreServerOptions o;
    o.bind = [](const ddprun::TcpStoreConnectionInfo&) { return std::optional<ddprun::StoreScope>({"fuzz", 1}); };
    o.stallTimeout = std::chrono::milliseconds(500);
    tcp = std::make_unique<ddprun::TcpStoreServer>(*core, o);
  }
  std::unique_ptr<ddprun::StoreCore> core;
  std::unique_ptr<ddprun::TcpStoreServer> tcp;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  static Server server;
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) return 0;
  ddprun::UniqueFd client(pair[0]);
  server.tcp->adopt(ddprun::UniqueFd(pair[1]));
  // Send everything (reading meanwhile, so a server that answers a lot cannot block us), then
  // half-close, then read to the end.
  std::size_t sent = 0;
  bool halfClosed = false;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  char buf[65536];
  while (true) {
    if (std::chrono::steady_clock::now() > until) violated("the server did not close the connection in 10 s");
    if (!halfClosed && sent == size) {
      ::shutdown(client.get(), SHUT_WR);
      halfClosed = true;
    }
    pollfd p{client.get(), static_cast<short>(POLLIN | (halfClosed ? 0 : POLLOUT)), 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    if (p.revents & POLLOUT) {
      const ssize_t n = ::send(client.get(), data + sent, size - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) sent += static_cast<std::size_t>(n);
      if (n < 0 && errno != EAGAIN) sent = size;  // the server closed: stop sending
    }
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      const ssize_t n = ::recv(client.get(), buf, sizeof buf, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN)) break;
    }
  }
  while (server.tcp->stats().open > 0 || server.core->store().stats().waits > 0) {
    if (std::chrono::steady_clock::now() > until) violated("a closed connection left a connection or a wait behind");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return 0;
}
