// Fuzz target: the store's own framing as a client could send it (store/store_wire.h). The input
// is the whole byte stream of one connection; it goes to a real StoreWireServer (its epoll
// thread, the StoreRequestHandler, a real StoreCore) through a socket pair, the client's side
// is then half-closed, and everything the server sends back is read.
//
// Properties:
// - the server closes the connection by itself once the client's side ended and every request it
//   sent is answered; where waits are still pending a second after the half-close (their timeouts
//   may be hours), the client goes away entirely and the server must then drop the connection
//   (nothing hangs, nothing leaks);
// - what it sends is its magic and then frames that parse as StoreResponse, the first with id 0;
// - every status message is at most kMaxErrorMessageBytes;
// - the server survives (no crash, no sanitizer report) whatever the bytes.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include <google/protobuf/stubs/logging.h>
#include <spdlog/spdlog.h>

#include "common/unique_fd.h"
#include "ddprun/v1/store.pb.h"
#include "common/error_message.h"
#include "store/core/store_core.h"
#include "store/wire/store_wire.h"
#include "store/wire/store_wire_server.h"

namespace {

[[noreturn]] void violated(const char* what) {
  std::fprintf(stderr, "fuzz_store_wire: property violated: %s\n", what);
  std::abort();
}

struct Server {
  Server() {
    spdlog::set_level(spdlog::level::off);
    google::protobuf::SetLogHandler(nullptr);
    ddprun::RunScopedStoreOptions limits;
    limits.maxBytesPerRun = 1 << 20;
    core = std::make_unique<ddprun::StoreCore>(ddprun::StoreCoreOptions{
        .token = "t", .roundIsCurrent = nullptr, .jobExists = nullptr, .maxPendingPerConnection = 1024, .limits = limits,
        .driveDeadlines = true});
    ddprun::StoreWireServerOptions o;
    o.helloTimeout = std::chrono::milliseconds(200);
    wire = std::make_unique<ddprun::StoreWireServer>(*core, o);
  }
  std::unique_ptr<ddprun::StoreCore> core;
  std::unique_ptr<ddprun::StoreWireServer> wire;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  static Server server;
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) return 0;
  ddprun::UniqueFd client(pair[0]);
  server.wire->adopt(ddprun::UniqueFd(pair[1]), "fuzz");
  // Send everything (reading meanwhile, so a server that answers a lot cannot block us), then
  // half-close, then read to the end.
  std::string got;
  std::size_t sent = 0;
  bool halfClosed = false;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::chrono::steady_clock::time_point halfClosedAt;
  char buf[65536];
  bool leftEntirely = false;
  while (true) {
    const auto now = std::chrono::steady_clock::now();
    if (now > until) violated("the server did not close the connection in 10 s");
    if (!halfClosed && sent == size) {
      ::shutdown(client.get(), SHUT_WR);
      halfClosed = true;
      halfClosedAt = now;
    }
    if (halfClosed && now - halfClosedAt > std::chrono::seconds(1) && server.core->store().stats().waits > 0) {
      // Answers are still owed, by waits that may last hours: leave entirely instead.
      client.reset();
      leftEntirely = true;
      break;
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
      if (n > 0) {
        got.append(buf, static_cast<std::size_t>(n));
      } else if (n == 0 || errno != EAGAIN) {
        break;
      }
    }
  }
  if (leftEntirely) {
    while (server.wire->stats().open > 0) {
      if (std::chrono::steady_clock::now() > until) violated("the server kept a connection whose client left");
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  if (got.empty()) return 0;
  if (got.compare(0, ddprun::storewire::kMagic.size(), ddprun::storewire::kMagic) != 0) violated("no magic first");
  ddprun::storewire::FrameReader reader(ddprun::storewire::kMaxFrameBytes);
  const std::string_view rest = std::string_view(got).substr(ddprun::storewire::kMagic.size());
  std::memcpy(reader.room(rest.size()), rest.data(), rest.size());
  reader.appended(rest.size());
  std::string_view payload;
  bool first = true;
  while (reader.next(payload) == ddprun::storewire::FrameReader::Next::kFrame) {
    ddprun::v1::StoreResponse response;
    if (!response.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) violated("an unreadable frame");
    if (first && response.id() != 0) violated("the hello's answer has an id");
    if (response.status().message().size() > ddprun::kMaxErrorMessageBytes) violated("a status message over the bound");
    first = false;
  }
  // A frame may be cut short only where the server closed for bytes no client sends, with an
  // answer partly written: not checked.
  return 0;
}
