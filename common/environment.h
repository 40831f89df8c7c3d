// An ordered set of environment variables: what a worker is started with.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ddprun {

class Environment {
 public:
  // A copy of this process's environment.
  static Environment fromCurrentProcess();

  void set(const std::string& name, const std::string& value) { vars_[name] = value; }
  // Sets name only when it is not present yet.
  void setDefault(const std::string& name, const std::string& value) { vars_.emplace(name, value); }
  void unset(const std::string& name) { vars_.erase(name); }
  bool contains(const std::string& name) const { return vars_.count(name) != 0; }
  std::optional<std::string> get(const std::string& name) const;

  const std::map<std::string, std::string>& vars() const { return vars_; }
  // "NAME=VALUE" strings, sorted by name.
  std::vector<std::string> toStrings() const;

 private:
  std::map<std::string, std::string> vars_;
};

}  // namespace ddprun
