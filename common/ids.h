// What the rendezvous and the store accept as a run id, a node id and a host: one rule each, used
// by the server on every request and by the command line. Ids name jobs in store paths
// (/run/<id>/round/<n>/) and appear in logs, so they are short and plain.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace ddprun {

inline constexpr std::size_t kMaxIdBytes = 256;

// nullopt when `id` is 1 to 256 bytes of [A-Za-z0-9._:@+=-]; else what is wrong (the id itself is
// not repeated: it may be anything).
std::optional<std::string> idProblem(std::string_view id);

// nullopt when `host` is an IPv4 or IPv6 address, or a hostname (RFC 1123: dot-separated labels of
// letters, digits and inner hyphens, each 1-63 bytes, 253 in all); else what is wrong.
std::optional<std::string> hostProblem(std::string_view host);

}  // namespace ddprun
