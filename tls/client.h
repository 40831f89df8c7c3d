// The client side of ddprun's TLS: gRPC channel credentials from PEM files, and a probe that
// says in one line why a TLS connection to a server fails (gRPC's channel only says that it does
// not connect, and retries a configuration error until its connect timeout).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "tls/tls_options.h"

namespace grpc {
class ChannelCredentials;
}

namespace ddprun {

// TLS credentials (with `o.enabled`) or insecure ones. Throws ConfigError naming an unreadable file.
std::shared_ptr<grpc::ChannelCredentials> channelCredentials(const TlsClientOptions& o);

struct TlsProbeResult {
  bool connected = false;    // the handshake passed and the server answered over it
  bool configError = false;  // a certificate or protocol mismatch: retrying cannot help
  std::string why;           // one line when not connected; empty when the probe could not tell
};

// Connects to `endpoint` (HOST:PORT) once, as a gRPC channel with `o` would, within `timeout`.
// Config errors: the server's certificate expired, is not signed by the CA, does not name the
// host, the server speaks plaintext, or it refused this node's certificate.
TlsProbeResult probeTls(const std::string& endpoint, const TlsClientOptions& o, std::chrono::milliseconds timeout);

// Whether the server at `endpoint` answers a TLS handshake (its certificate is not checked): for
// a plaintext client that cannot connect, to say that the server wants TLS. False when it cannot
// be told within `timeout`.
bool speaksTls(const std::string& endpoint, std::chrono::milliseconds timeout);

}  // namespace ddprun
