// A store core with the TCPStore adapter on 127.0.0.1 (port 0), for tests that drive it with
// torch's own TCPStore client (tests/integration/test_tcpstore_protocol.py). Built for the tests,
// never shipped. Prints "PORT <n>" once it listens; binds every connection to one scope
// (--run_id, default "none"; --round, default 1); exits on SIGTERM, SIGINT or end of stdin.
//   --max_connections N   TcpStoreServerOptions::maxConnections
//   --wait_deadline_ms N  TcpStoreServerOptions::waitDeadline
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/unique_fd.h"
#include "store/core/store_core.h"
#include "store/tcpstore/tcpstore_server.h"

int main(int argc, char** argv) {
  std::string runId = "none";
  uint64_t round = 1;
  ddprun::TcpStoreServerOptions options;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string value = argv[i + 1];
    if (flag == "--run_id") {
      runId = value;
    } else if (flag == "--round") {
      round = std::stoull(value);
    } else if (flag == "--max_connections") {
      options.maxConnections = std::stoull(value);
    } else if (flag == "--wait_deadline_ms") {
      options.waitDeadline = std::chrono::milliseconds(std::stoll(value));
    } else {
      std::fprintf(stderr, "tcpstore_server: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigprocmask(SIG_BLOCK, &signals, nullptr);
  ddprun::UniqueFd sigFd(::signalfd(-1, &signals, SFD_CLOEXEC));

  ddprun::UniqueFd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (!listener || ::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(listener.get(), 1024) != 0 || ::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::perror("tcpstore_server: listen");
    return 1;
  }

  ddprun::StoreCore core(ddprun::StoreCoreOptions{});
  options.bind = [runId, round](const ddprun::TcpStoreConnectionInfo&) {
    return std::optional<ddprun::StoreScope>(ddprun::StoreScope{runId, round});
  };
  ddprun::TcpStoreServer server(core, options);
  std::printf("PORT %d\n", ntohs(addr.sin_port));
  std::fflush(stdout);

  bool stdinOpen = true;
  while (true) {
    pollfd fds[3] = {{listener.get(), POLLIN, 0}, {sigFd.get(), POLLIN, 0}, {stdinOpen ? 0 : -1, POLLIN, 0}};
    if (::poll(fds, 3, -1) < 0) continue;
    if (fds[1].revents) break;
    if (fds[2].revents) {
      char buf[256];
      if (::read(0, buf, sizeof buf) <= 0) break;
    }
    if (fds[0].revents & POLLIN) {
      ddprun::UniqueFd conn(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (conn) server.adopt(std::move(conn));
    }
  }
  server.stop();
  core.shutdown();
  const auto s = server.stats();
  std::fprintf(stderr, "tcpstore_server: accepted %llu, refused %llu, closed broken %llu, failed %llu, stalled %llu, legacy %llu\n",
               static_cast<unsigned long long>(s.accepted), static_cast<unsigned long long>(s.refused),
               static_cast<unsigned long long>(s.closedBroken), static_cast<unsigned long long>(s.closedFailed),
               static_cast<unsigned long long>(s.closedStalled), static_cast<unsigned long long>(s.legacy));
  return 0;
}
