// What a new connection's first bytes say it is: the front door's classification, before it hands
// the connection on (to gRPC, the relay, or a side protocol such as the store's framing). A pure
// function, so that every opening a client may send has a unit case (connection_opening_test.cc).
#pragma once

#include <cstddef>
#include <string_view>

namespace ddprun {

enum class Opening {
  kNeedMore,        // a prefix of an opening we know: look again when more has come
  kHttp2,           // plaintext: a preface's length of bytes, for gRPC (or the relay) to judge
  kSideProtocol,    // plaintext: the side protocol's whole magic
  kTlsHandshake,    // TLS on: a handshake record starts it
  kPlaintextOnTls,  // TLS on: an HTTP/2 preface instead; refused in words, so its agent can say why
  kNotTls,          // TLS on: anything else; closed
};

// The bytes of an HTTP/2 client preface: what the listener waits for before it hands over.
inline constexpr std::size_t kHttp2PrefaceBytes = 24;

struct OpeningRules {
  bool tls = false;
  std::string_view sideMagic;  // empty: no side protocol
};

// Classifies `peeked`, the first bytes the connection sent (at most kHttp2PrefaceBytes of them are
// read). kNeedMore for a connection that ended is the caller's to close.
Opening classifyOpening(std::string_view peeked, const OpeningRules& rules);

}  // namespace ddprun
