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
#include <functional>
#include <memory>
#include <string>

#include "common/unique_fd.h"
#include "netguard/abuse_guard.h"
#include "tls/server_context.h"

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
  // Calls a connection may start, and how long an address that broke the limits is refused.
  AbuseLimits abuse;
  // Relay every connection through a ConnectionRelay, which cuts it as soon as it opens streams
  // or sends control frames faster than `abuse` allows (connection_relay.h). Costs two more
  // descriptors per connection and a copy of each byte.
  bool relay = false;
  // The server checks a job token: a relayed connection may open only untrustedCallBurst streams
  // until admitCall sees its first call with the valid token.
  bool tokenRequired = false;
  // Off: no connection waits to show the token, each is trusted at once (`--connection_guard=off`,
  // docs/rendezvous.md). The relay's frame limits, and the penalty of an address that broke them,
  // stay: without them gRPC 1.51's memory has no bound under rapid reset.
  bool gate = true;
  // The token itself, and the request header that carries it: the relay trusts a connection whose
  // first request headers carry it, before gRPC reads them (token_recognizer.h). Empty: it waits
  // for the server's admitCall, as before.
  std::string token;
  std::string tokenMetadataKey;
  // TLS, terminated in the relay (which is then on whatever `relay` says): a connection must start
  // a TLS handshake; one that sends the plaintext HTTP/2 preface is told that this server requires
  // TLS (a GOAWAY with tls/client.h's kTlsRequiredReason). The handshake must end within
  // handshakeTimeout. Null: plaintext.
  std::shared_ptr<TlsServerContext> tls;
  // A second protocol on the same port, told apart by its first bytes: a connection that opens
  // with `magic` (never the HTTP/2 preface's start) goes to `accept` instead of gRPC, with the
  // bytes unread (the store's own framing, store/store_wire.h). Not with TLS. Empty magic: none.
  struct SideProtocol {
    std::string magic;
    std::function<void(UniqueFd fd, const std::string& address)> accept;
  } sideProtocol;
};

struct ConnectionListenerStats {
  uint64_t handedOver = 0;      // to gRPC
  uint64_t refusedAtCap = 0;    // closed at once: the cap was reached
  uint64_t closedSilent = 0;    // no preface within the handshake deadline, or closed before it
  uint64_t acceptErrors = 0;    // EMFILE, ENFILE, ENOBUFS...: recovered with backoff
  uint64_t closedForAbuse = 0;  // broke the call limits (AbuseLimits): closed by admitCall
  uint64_t refusedPenalized = 0;  // closed at once: their address abused the server lately
  uint64_t relayCutForAbuse = 0;  // relayed connections cut for their frames (streams, control)
  uint64_t open = 0;              // connections handed to gRPC and not closed yet (a gauge)
  uint64_t tlsFailed = 0;         // TLS handshakes that failed or timed out, and plaintext clients
  uint64_t handedToSide = 0;      // to the side protocol (ConnectionListenerOptions::sideProtocol)
  uint64_t evictedIdle = 0;       // at the cap: an idle connection without the token cut for a newcomer
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
  // Called by the services as a call starts, before anything else is done for it: whether the
  // call's connection (gRPC's peer string) is within the AbuseLimits. When it is not, the
  // connection is shut down (gRPC then cancels its calls and frees them), its address is refused
  // for a while, and false is returned: the caller finishes the call at once. Unknown peers (not
  // from this listener) are admitted.
  bool admitCall(const std::string& grpcPeer, bool authenticated);
  // `address` broke the limits on a connection served elsewhere (the side protocol): refuse it
  // for a while, as after a call over the limits, and say so.
  void penalize(const std::string& address, const std::string& why);

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun
