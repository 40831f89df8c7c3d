// Comparing secrets (job tokens) without telling an attacker where they differ.
#pragma once

#include <string_view>

namespace ddprun {

// Compares two secrets in time that depends only on their lengths, not on where they differ.
bool constantTimeEquals(std::string_view a, std::string_view b);

}  // namespace ddprun
