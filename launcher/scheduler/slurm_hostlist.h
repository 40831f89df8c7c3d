// Slurm's hostlist expressions ("n[008-011],gpu[1,3-4]", "rack[0-1]-b[1-2]") expanded into host
// names, as `scontrol show hostnames` does. Pure: no lookup, no environment.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun {

// The most hosts one expression may expand to. Slurm refuses a single range longer than this
// (65,536); the bound also keeps "n[0-99999999]" or a cross product from allocating gigabytes.
inline constexpr std::size_t kMaxHostlistHosts = 65536;

// Expands `expression` in Slurm's order; duplicates are kept, as Slurm keeps them. Grammar:
// hosts are separated by ',', ' ', '\t' or '\n' outside brackets; a bracket group holds
// comma-separated numbers or LO-HI ranges, zero-padded to the width of LO ("n[08-11]": n08..n11);
// several groups in one name expand as a cross product; nothing may follow the last group (as in
// Slurm: "n[1-2]-ib" is invalid there). Throws ConfigError on a malformed expression (unbalanced
// or nested brackets, an empty, reversed or non-numeric range, a number over 18 digits) and on
// more than `maxHosts` hosts, with what is wrong. An empty expression gives no hosts.
std::vector<std::string> expandSlurmHostlist(std::string_view expression,
                                             std::size_t maxHosts = kMaxHostlistHosts);

}  // namespace ddprun
