#include "common/environment.h"

#include <cstring>

extern char** environ;

namespace ddprun {

Environment Environment::fromCurrentProcess() {
  Environment env;
  for (char** entry = environ; entry && *entry; ++entry) {
    const char* eq = std::strchr(*entry, '=');
    if (!eq || eq == *entry) continue;
    env.vars_.emplace(std::string(*entry, static_cast<size_t>(eq - *entry)), std::string(eq + 1));
  }
  return env;
}

std::optional<std::string> Environment::get(const std::string& name) const {
  auto it = vars_.find(name);
  if (it == vars_.end()) return std::nullopt;
  return it->second;
}

std::vector<std::string> Environment::toStrings() const {
  std::vector<std::string> out;
  out.reserve(vars_.size());
  for (const auto& [name, value] : vars_) out.push_back(name + "=" + value);
  return out;
}

}  // namespace ddprun
