// The front door's classification of a connection's first bytes (netguard/connection_opening.h).
#include <catch2/catch.hpp>

#include <string>

#include "netguard/connection_opening.h"

using ddprun::classifyOpening;
using ddprun::Opening;
using ddprun::OpeningRules;

namespace {

const std::string kPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
constexpr std::string_view kMagic = "DDPSTORE";

}  // namespace

TEST_CASE("connection opening: plaintext, with the store's framing beside gRPC", "[netguard][opening]") {
  const OpeningRules rules{.tls = false, .sideMagic = kMagic};
  CHECK(classifyOpening("", rules) == Opening::kNeedMore);
  CHECK(classifyOpening(kPreface.substr(0, 10), rules) == Opening::kNeedMore);
  CHECK(classifyOpening(kPreface, rules) == Opening::kHttp2);
  CHECK(classifyOpening("DDP", rules) == Opening::kNeedMore);  // part of the magic: wait for the rest
  CHECK(classifyOpening("DDPSTORE", rules) == Opening::kSideProtocol);
  CHECK(classifyOpening(std::string("DDPSTORE\0\0\0\x05hello", 17), rules) == Opening::kSideProtocol);
  // Not the magic, and not yet a preface's length: wait; then gRPC (or the relay) judges the bytes.
  CHECK(classifyOpening("DDPX", rules) == Opening::kNeedMore);
  CHECK(classifyOpening(std::string(24, 'x'), rules) == Opening::kHttp2);
}

TEST_CASE("connection opening: plaintext without a side protocol", "[netguard][opening]") {
  const OpeningRules rules{.tls = false, .sideMagic = {}};
  CHECK(classifyOpening("DDPSTORE", rules) == Opening::kNeedMore);
  CHECK(classifyOpening("DDPSTORE" + std::string(16, '\0'), rules) == Opening::kHttp2);
}

TEST_CASE("connection opening: TLS on", "[netguard][opening]") {
  const OpeningRules rules{.tls = true, .sideMagic = kMagic};
  CHECK(classifyOpening("", rules) == Opening::kNeedMore);
  CHECK(classifyOpening("\x16", rules) == Opening::kTlsHandshake);
  CHECK(classifyOpening("\x16\x03\x01\x02\x00", rules) == Opening::kTlsHandshake);
  CHECK(classifyOpening("PR", rules) == Opening::kNeedMore);
  CHECK(classifyOpening(kPreface, rules) == Opening::kPlaintextOnTls);
  CHECK(classifyOpening("GET / HTTP/1.1", rules) == Opening::kNotTls);
  // The store's framing is plaintext only: over TLS its magic is no handshake.
  CHECK(classifyOpening("DDPSTORE", rules) == Opening::kNotTls);
}
