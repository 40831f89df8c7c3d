// A Slurm node's address when its name does not resolve. Slurm reaches nodes by NodeAddr, so on
// many clusters a node name is known to Slurm alone; `scontrol show node NAME` tells the address.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

namespace ddprun {

// NodeAddr from the output of `scontrol [-o] show node NAME`; nullopt when there is none.
std::optional<std::string> parseNodeAddr(std::string_view scontrolOutput);

// Runs `scontrol -o show node NAME` (scontrol from PATH) for at most `timeout` and returns its
// NodeAddr; nullopt when scontrol is missing, fails, says nothing useful or runs out of time (it
// is then killed). Blocks the caller; meant for the command line, before anything starts.
std::optional<std::string> querySlurmNodeAddr(const std::string& node, std::chrono::milliseconds timeout);

}  // namespace ddprun
