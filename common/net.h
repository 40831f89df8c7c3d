// Host names and ports.
#pragma once

#include <optional>
#include <string>
#include <utility>

namespace ddprun {

// This machine's host name (gethostname).
std::string hostName();

// A TCP port that is free on `host` right now (bound, then released), for a server that binds it
// later (MASTER_PORT). Picked at random below the kernel's ephemeral range (ephemeralPortStart())
// when there is room: a port bound with port 0, as torchrun picks it, comes from that range, which
// every outgoing connection of the machine draws from too, and one of them can take it before
// the worker binds it (seen under parallel tests: "Address already in use"). Falls back to port 0
// when nothing below the range is free. Throws ConnectionError naming the host when it cannot be
// resolved or bound.
int findFreePort(const std::string& host);
// The same, picking in [low, high) first (empty: port 0 at once).
int findFreePort(const std::string& host, int low, int high);

// The first port of the kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range),
// 32768 when it cannot be read.
int ephemeralPortStart();

// "host", "host:port", "[v6]:port", "v6addr" -> host and port (defaultPort when absent). Throws
// ConfigError on a malformed endpoint or port.
std::pair<std::string, int> parseEndpoint(const std::string& endpoint, int defaultPort);
// Joins host and port, bracketing IPv6 hosts.
std::string joinHostPort(const std::string& host, int port);

// Whether two texts are IP addresses of the same host ("::ffff:10.0.0.1" is "10.0.0.1"); nullopt
// when either is not an IP address (a host name: telling would take a DNS lookup).
std::optional<bool> sameAddress(const std::string& a, const std::string& b);

}  // namespace ddprun
