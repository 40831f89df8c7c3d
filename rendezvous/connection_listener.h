// The rendezvous server's own accept loop. gRPC 1.51's listener stops accepting for good after one
// accept() fails with EMFILE, so a connection flood wedged the daemon; this one owns the listening
// socket and hands each connection to gRPC (AddInsecureChannelFromFd) once the client has sent
// the HTTP/2 preface. It keeps the process below its open-file limit (a reserve for the store,
// pipes and gRPC itself), closes connections that send nothing within the handshake deadline,
// and recovers from EMFILE/ENFILE with backoff and a spare descriptor.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace grpc {
class Server;
}

namespace ddprun {

struct ConnectionListenerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: any free port
  // Connections open at once (waiting for their preface or handed to gRPC); more are closed at
  // once. 0: the open-file limit minus reserveFds.
  std::size_t maxConnections = 0;
  // Descriptors always left free for everything but connections.
  std::size_t reserveFds = 128;
  // A connection that has not sent the HTTP/2 preface by then is closed.
  std::chrono::milliseconds handshakeTimeout{std::chrono::seconds(10)};
};

struct ConnectionListenerStats {
  uint64_t handedOver = 0;      // to gRPC
  uint64_t refusedAtCap = 0;    // closed at once: the cap was reached
  uint64_t closedSilent = 0;    // no preface within the handshake deadline, or closed before it
  uint64_t acceptErrors = 0;    // EMFILE, ENFILE, ENOBUFS...: recovered with backoff
};

class ConnectionListener {
 public:
  // Binds and listens at once; throws ConnectionError naming the address when it cannot.
  explicit ConnectionListener(ConnectionListenerOptions options);
  ~ConnectionListener();
  ConnectionListener(const ConnectionListener&) = delete;
  ConnectionListener& operator=(const ConnectionListener&) = delete;

  int port() const;
  // Starts the accept thread; connections go to `server`, which must outlive stop().
  void start(grpc::Server* server);
  // Stops accepting and closes connections still waiting for their preface. Idempotent.
  void stop();
  ConnectionListenerStats stats() const;
  // The client's address ("192.0.2.7", "::1") of a connection this listener handed to gRPC, from
  // gRPC's peer string for it ("fd:17"); empty when unknown. gRPC knows such a connection only by
  // its descriptor, so the listener remembers who connected on it.
  std::string peerAddress(const std::string& grpcPeer) const;

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun
