// The TCPStore codec (store/tcpstore/tcpstore_codec.h) on bytes: dialect detection, both
// numberings, partial commands and what they declare, and the bounds that make a command bad.
#include "store/tcpstore/tcpstore_codec.h"

#include <catch2/catch.hpp>

#include <string>

#include "store/core/store_limits.h"

namespace ts = ddprun::tcpstore;

namespace {

std::string u64(uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }
std::string str(const std::string& s) { return u64(s.size()) + s; }

}  // namespace

TEST_CASE("tcpstore codec: a 2.x opening is VALIDATE and the magic, anything else is 1.13", "[tcpstore]") {
  ts::Dialect d = ts::Dialect::kUnknown;
  std::string v2(1, '\0');
  ts::appendU32(v2, ts::kValidationMagic);
  CHECK(ts::detectDialect(v2.substr(0, 3), d).kind == ts::ParseResult::Kind::kNeedMore);
  auto r = ts::detectDialect(v2, d);
  CHECK(r.kind == ts::ParseResult::Kind::kCommand);
  CHECK(r.consumed == 5);
  CHECK(d == ts::Dialect::kV2);
  d = ts::Dialect::kUnknown;
  const std::string legacySet = std::string(1, '\0') + str("/k") + str("v");  // 1.13 SET
  r = ts::detectDialect(legacySet, d);
  CHECK(r.consumed == 0);
  CHECK(d == ts::Dialect::kLegacy);
  d = ts::Dialect::kUnknown;
  ts::detectDialect(std::string(1, '\x05'), d);
  CHECK(d == ts::Dialect::kLegacy);
}

TEST_CASE("tcpstore codec: both numberings", "[tcpstore]") {
  CHECK(ts::opFromByte(ts::Dialect::kV2, 1) == ts::Op::kSet);
  CHECK(ts::opFromByte(ts::Dialect::kV2, 13) == ts::Op::kPing);
  CHECK(ts::opFromByte(ts::Dialect::kV2, 18) == ts::Op::kBarrier);
  CHECK_FALSE(ts::opFromByte(ts::Dialect::kV2, 19));
  CHECK(ts::opFromByte(ts::Dialect::kLegacy, 0) == ts::Op::kSet);
  CHECK(ts::opFromByte(ts::Dialect::kLegacy, 7) == ts::Op::kWatchKey);
  CHECK(ts::opFromByte(ts::Dialect::kLegacy, 8) == ts::Op::kDelete);
  CHECK_FALSE(ts::opFromByte(ts::Dialect::kLegacy, 9));
}

TEST_CASE("tcpstore codec: whole, partial and bad commands", "[tcpstore]") {
  ts::Command c;
  const std::string set = std::string(1, '\x01') + str("/k") + str("value");
  auto r = ts::parseCommand(set, ts::Dialect::kV2, c);
  REQUIRE(r.kind == ts::ParseResult::Kind::kCommand);
  CHECK(r.consumed == set.size());
  CHECK(c.op == ts::Op::kSet);
  CHECK(c.keys == std::vector<std::string>{"/k"});
  CHECK(c.values == std::vector<std::string>{"value"});
  for (std::size_t cut = 1; cut < set.size(); ++cut) {
    r = ts::parseCommand(set.substr(0, cut), ts::Dialect::kV2, c);
    CHECK(r.kind == ts::ParseResult::Kind::kNeedMore);
    CHECK(r.declared > cut);
    CHECK(r.declared <= set.size());
  }
  // A large value declares its whole size once its length is here.
  r = ts::parseCommand(std::string(1, '\x01') + str("/k") + u64(1 << 20), ts::Dialect::kV2, c);
  CHECK(r.declared == 1 + 8 + 2 + 8 + (1u << 20));
  r = ts::parseCommand(std::string(1, '\x01') + u64(ddprun::kMaxStoreKeyBytes + 1), ts::Dialect::kV2, c);
  CHECK(r.kind == ts::ParseResult::Kind::kBad);
  r = ts::parseCommand(std::string(1, '\x0a') + u64(ddprun::kMaxStoreKeysPerRequest + 1), ts::Dialect::kV2, c);
  CHECK(r.kind == ts::ParseResult::Kind::kBad);
  // Values that together pass the message bound.
  std::string two = std::string(1, '\x0b') + u64(2) + str("/a") + u64(ddprun::kMaxStoreValueBytes);
  two += std::string(ddprun::kMaxStoreValueBytes, 'v') + str("/b") + u64(ddprun::kMaxStoreValueBytes);
  r = ts::parseCommand(two, ts::Dialect::kV2, c);
  CHECK(r.kind == ts::ParseResult::Kind::kBad);
  r = ts::parseCommand(std::string(1, '\x63'), ts::Dialect::kV2, c);
  CHECK(r.kind == ts::ParseResult::Kind::kBad);
  // Ping's nonce and add's delta.
  std::string ping(1, '\x0d');
  ts::appendU32(ping, 42);
  r = ts::parseCommand(ping, ts::Dialect::kV2, c);
  CHECK(c.nonce == 42);
  std::string add = std::string(1, '\x03') + str("/n");  // 1.13's ADD
  ts::appendI64(add, -3);
  r = ts::parseCommand(add, ts::Dialect::kLegacy, c);
  CHECK(c.op == ts::Op::kAdd);
  CHECK(c.number == -3);
}
