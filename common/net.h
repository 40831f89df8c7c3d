// Host names and ports.
#pragma once

#include <optional>
#include <string>
#include <utility>

namespace ddprun {

// This machine's host name (gethostname).
std::string hostName();

// A TCP port that is free on `host` right now: bound with port 0, then released. The OS does not
// hand the same ephemeral port out again soon, which is the same guarantee torchrun relies on.
// Throws ConnectionError naming the host when it cannot be resolved or bound.
int findFreePort(const std::string& host);

// "host", "host:port", "[v6]:port", "v6addr" -> host and port (defaultPort when absent). Throws
// ConfigError on a malformed endpoint or port.
std::pair<std::string, int> parseEndpoint(const std::string& endpoint, int defaultPort);
// Joins host and port, bracketing IPv6 hosts.
std::string joinHostPort(const std::string& host, int port);

// Whether two texts are IP addresses of the same host ("::ffff:10.0.0.1" is "10.0.0.1"); nullopt
// when either is not an IP address (a host name: telling would take a DNS lookup).
std::optional<bool> sameAddress(const std::string& a, const std::string& b);

}  // namespace ddprun
