// `ddprun-rdzv status`: what a rendezvous knows of its jobs, for people (a table) and for tools
// (--json, a stable format documented in the README). It reads a ddprun-rdzv daemon or an agent
// that hosts its job's rendezvous with the read-only Status call, or an etcd job from etcd's
// records (the same conversion, status_proto.h).
#pragma once

#include <string>
#include <vector>

namespace ddprun {

// Exit statuses of the command: 0 answered; 1 no such job; 2 bad command line, a refused token
// or TLS configuration (a scheduler must not retry it); 200 (kExitInfrastructure) the rendezvous
// could not be reached.
int statusCommand(const std::vector<std::string>& args);

}  // namespace ddprun
