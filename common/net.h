// Host names and ports.
#pragma once

#include <string>

namespace ddprun {

// This machine's host name (gethostname).
std::string hostName();

// A TCP port that is free on `host` right now: bound with port 0, then released. The OS does not
// hand the same ephemeral port out again soon, which is the same guarantee torchrun relies on.
// Throws ConnectionError naming the host when it cannot be resolved or bound.
int findFreePort(const std::string& host);

}  // namespace ddprun
