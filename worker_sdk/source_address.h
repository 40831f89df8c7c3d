// Which local address a job's peers can reach this machine on (internal).
#pragma once

#include <optional>
#include <string>

namespace ddp::detail {

// The local address the kernel would send from to reach host:port (a UDP socket connected, then
// getsockname; no packet is sent): loopback for a loopback host, else the address of the
// interface on the route. nullopt when the host does not resolve or has no route.
std::optional<std::string> sourceAddressToward(const std::string& host, int port);

// The first numeric address of host (getaddrinfo), or nullopt when it does not resolve. gloo's
// TCP device (Debian's 2022 gloo) walks an uninitialized pointer when its own getaddrinfo fails,
// so it only ever gets numeric hosts.
std::optional<std::string> numericAddress(const std::string& host);

}  // namespace ddp::detail
