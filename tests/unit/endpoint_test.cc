// parseEndpoint and joinHostPort (rendezvous/server/rendezvous_server.h): the --rdzv_endpoint forms
// "host", "host:port", "[v6]:port" and a bare IPv6 address, and every malformed one as ConfigError.
#include <catch2/catch.hpp>

#include <string>
#include <utility>

#include "common/error.h"
#include "common/net.h"

using ddprun::joinHostPort;
using ddprun::parseEndpoint;
using Catch::Matchers::Contains;
using Endpoint = std::pair<std::string, int>;

TEST_CASE("endpoint: a host alone takes the default port", "[endpoint]") {
  CHECK(parseEndpoint("localhost", 29400) == Endpoint{"localhost", 29400});
  CHECK(parseEndpoint("10.0.0.7", 29500) == Endpoint{"10.0.0.7", 29500});
  CHECK(parseEndpoint("node-1.cluster.example", 1) == Endpoint{"node-1.cluster.example", 1});
}

TEST_CASE("endpoint: host:port", "[endpoint]") {
  CHECK(parseEndpoint("localhost:29500", 29400) == Endpoint{"localhost", 29500});
  CHECK(parseEndpoint("10.0.0.7:1234", 29400) == Endpoint{"10.0.0.7", 1234});
  CHECK(parseEndpoint("host:0", 29400) == Endpoint{"host", 0});
  CHECK(parseEndpoint("host:65535", 29400) == Endpoint{"host", 65535});
}

TEST_CASE("endpoint: bracketed IPv6 with and without a port", "[endpoint]") {
  CHECK(parseEndpoint("[::1]:29500", 29400) == Endpoint{"::1", 29500});
  CHECK(parseEndpoint("[fe80::1:2]:80", 29400) == Endpoint{"fe80::1:2", 80});
  CHECK(parseEndpoint("[::1]", 29400) == Endpoint{"::1", 29400});
}

TEST_CASE("endpoint: a bare IPv6 address is a host without a port", "[endpoint]") {
  CHECK(parseEndpoint("::1", 29400) == Endpoint{"::1", 29400});
  CHECK(parseEndpoint("2001:db8::42", 29400) == Endpoint{"2001:db8::42", 29400});
  CHECK(parseEndpoint("::", 7) == Endpoint{"::", 7});
}

TEST_CASE("endpoint: a bad port is a ConfigError", "[endpoint]") {
  for (const char* endpoint : {"host:abc", "host:65536", "host:-1", "host:99999999999999999999", "host:80x",
                               "host: 80", "[::1]:abc", "[::1]:70000", "[::1]:-5"}) {
    INFO("endpoint: " << endpoint);
    CHECK_THROWS_AS(parseEndpoint(endpoint, 29400), ddprun::ConfigError);
    CHECK_THROWS_WITH(parseEndpoint(endpoint, 29400), Contains(endpoint));
  }
}

TEST_CASE("endpoint: a colon with no port after it is a ConfigError", "[endpoint]") {
  // "host:" names no port: taking the default silently would hide a typo, as torchrun refuses it.
  for (const char* endpoint : {"host:", "[::1]:"}) {
    INFO("endpoint: " << endpoint);
    CHECK_THROWS_AS(parseEndpoint(endpoint, 29400), ddprun::ConfigError);
  }
}

TEST_CASE("endpoint: brackets must be closed and followed by :PORT only", "[endpoint]") {
  for (const char* endpoint : {"[::1", "[::1:29500", "[", "[::1]29500", "[::1]x", "[::1]]:80"}) {
    INFO("endpoint: " << endpoint);
    CHECK_THROWS_AS(parseEndpoint(endpoint, 29400), ddprun::ConfigError);
  }
  CHECK_THROWS_WITH(parseEndpoint("[::1", 29400), Contains("]"));
}

TEST_CASE("endpoint: an empty host is a ConfigError", "[endpoint]") {
  for (const char* endpoint : {"", ":29500", "[]:29500", "[]", ":"}) {
    INFO("endpoint: '" << endpoint << "'");
    CHECK_THROWS_AS(parseEndpoint(endpoint, 29400), ddprun::ConfigError);
  }
  CHECK_THROWS_WITH(parseEndpoint(":29500", 29400), Contains("host"));
}

TEST_CASE("endpoint: joinHostPort brackets IPv6 and round-trips through parseEndpoint", "[endpoint]") {
  CHECK(joinHostPort("localhost", 29500) == "localhost:29500");
  CHECK(joinHostPort("10.0.0.7", 1) == "10.0.0.7:1");
  CHECK(joinHostPort("::1", 29500) == "[::1]:29500");
  CHECK(joinHostPort("fe80::1", 0) == "[fe80::1]:0");
  for (const Endpoint& e : {Endpoint{"localhost", 29500}, Endpoint{"::1", 1}, Endpoint{"2001:db8::42", 65535},
                            Endpoint{"10.1.2.3", 0}}) {
    INFO(e.first << " " << e.second);
    CHECK(parseEndpoint(joinHostPort(e.first, e.second), 29400) == e);
  }
}

TEST_CASE("sameAddress: IP addresses of one host in any spelling, host names are not compared", "[net]") {
  CHECK(ddprun::sameAddress("127.0.0.1", "127.0.0.1") == true);
  CHECK(ddprun::sameAddress("::ffff:127.0.0.1", "127.0.0.1") == true);
  CHECK(ddprun::sameAddress("2001:db8::1", "2001:0db8:0:0::1") == true);
  CHECK(ddprun::sameAddress("192.0.2.1", "192.0.2.2") == false);
  CHECK(ddprun::sameAddress("::1", "127.0.0.1") == false);
  CHECK_FALSE(ddprun::sameAddress("localhost", "127.0.0.1").has_value());
  CHECK_FALSE(ddprun::sameAddress("", "").has_value());
  CHECK_FALSE(ddprun::sameAddress(std::string("127.0.0.1\0junk", 14), "127.0.0.1").has_value());
}
