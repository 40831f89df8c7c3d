#include "common/ids.h"

#include <catch2/catch.hpp>
#include <string>

#include "common/strings.h"

using ddprun::hostProblem;
using ddprun::idProblem;
using ddprun::printable;

TEST_CASE("ids: letters, digits and . _ : @ + = - up to 256 bytes", "[ids]") {
  for (const char* ok : {"job42", "none", "4f1c2a9e-1b2c-4d3e-8f90-0123456789ab", "host-1:4242:99", "a.b_c:d@e+f=g-h",
                         "1234_0_0"}) {
    INFO(ok);
    CHECK_FALSE(idProblem(ok).has_value());
  }
  CHECK_FALSE(idProblem(std::string(256, 'x')).has_value());
  CHECK(idProblem(std::string(257, 'x')).value() == "is 257 bytes, more than 256");
  CHECK(idProblem("").value() == "is empty");
  for (const char* bad : {"a b", "a/b", "a\nb", "a\x1b[31m", "a\\b", "a'b", "caf\xc3\xa9", "a\tb", "*"}) {
    INFO(bad);
    REQUIRE(idProblem(bad).has_value());
    CHECK(idProblem(bad)->find(bad) == std::string::npos);  // never echoes the id
  }
}

TEST_CASE("hosts: hostnames (RFC 1123) and IP addresses", "[ids]") {
  for (const char* ok : {"localhost", "node-07.cluster.local", "h", "192.0.2.7", "::1", "fe80::1", "2001:db8::7",
                         "0node", "a1-b2.c3"}) {
    INFO(ok);
    CHECK_FALSE(hostProblem(ok).has_value());
  }
  CHECK_FALSE(hostProblem(std::string(63, 'a') + "." + std::string(63, 'b')).has_value());
  for (std::string bad : {std::string(""), std::string("a b"), std::string("-a"), std::string("a-"),
                          std::string("a..b"), std::string(".a"), std::string("a."), std::string(64, 'a'),
                          std::string(254, 'a'), std::string("1.2.3.4:80"), std::string("[::1]"),
                          std::string("a_b"), std::string("evil\n.example"), std::string("::g"),
                          std::string("::1\0\x1b[2J", 8), std::string("fe80::fe\0\0\0\0:1", 14)}) {
    INFO(bad);
    CHECK(hostProblem(bad).has_value());
  }
}

TEST_CASE("printable: control and non-ASCII bytes escaped, long text cut with a count", "[strings]") {
  CHECK(printable("plain text: ok") == "plain text: ok");
  CHECK(printable("a\nb\x1b[2J") == "a\\x0ab\\x1b[2J");
  CHECK(printable("back\\slash") == "back\\x5cslash");
  CHECK(printable("caf\xc3\xa9") == "caf\\xc3\\xa9");
  CHECK(printable(std::string(10, 'x'), 4) == "xxxx... (+6 bytes)");
  CHECK(printable(std::string(1 << 20, 'y')).size() < 200);
  CHECK(printable("") == "");
}
