#include "agent/log_options.h"

#include "common/error.h"
#include "common/strings.h"

namespace ddprun {
namespace {

int parseStreams(std::string_view text, const std::string& flagName, const std::string& whole) {
  auto value = parseInt(trim(text));
  if (!value || *value < 0 || *value > 3) {
    throw ConfigError(flagName + " '" + whole + "': stream value must be 0 (none), 1 (stdout), 2 (stderr) or 3 (both)");
  }
  return static_cast<int>(*value);
}

}  // namespace

int StreamSpec::forRank(int localRank) const {
  auto it = perRank.find(localRank);
  return it == perRank.end() ? all : it->second;
}

StreamSpec StreamSpec::parse(const std::string& text, const std::string& flagName) {
  StreamSpec spec;
  if (trim(text).empty()) return spec;
  if (text.find(':') == std::string::npos) {
    spec.all = parseStreams(text, flagName, text);
    return spec;
  }
  for (const auto& entry : split(text, ',')) {
    auto parts = split(entry, ':');
    auto rank = parts.size() == 2 ? parseInt(trim(parts[0])) : std::nullopt;
    if (!rank || *rank < 0) {
      throw ConfigError(flagName + " '" + text + "': expected LOCAL_RANK:VALUE pairs such as 0:3,1:2");
    }
    spec.perRank[static_cast<int>(*rank)] = parseStreams(parts[1], flagName, text);
  }
  return spec;
}

std::set<int> LogOptions::parseRankFilter(const std::string& text) {
  std::set<int> ranks;
  std::string normalized = text;
  for (char& c : normalized) {
    if (c == ' ') c = ',';
  }
  for (const auto& part : split(normalized, ',')) {
    if (trim(part).empty()) continue;
    auto rank = parseInt(trim(part));
    if (!rank || *rank < 0) {
      throw ConfigError("--local_ranks_filter '" + text + "': expected local ranks such as 0,1");
    }
    ranks.insert(static_cast<int>(*rank));
  }
  return ranks;
}

namespace {

// Calls onField(name) for every {name} / ${name}, onText for the rest.
template <class OnText, class OnField>
void scanTemplate(const std::string& tmpl, OnText onText, OnField onField) {
  size_t i = 0;
  while (i < tmpl.size()) {
    size_t start = tmpl.find('{', i);
    if (start == std::string::npos) {
      onText(std::string_view(tmpl).substr(i));
      return;
    }
    size_t textEnd = (start > i && tmpl[start - 1] == '$') ? start - 1 : start;
    onText(std::string_view(tmpl).substr(i, textEnd - i));
    size_t close = tmpl.find('}', start);
    if (close == std::string::npos) throw ConfigError("log line prefix template '" + tmpl + "': unclosed '{'");
    onField(tmpl.substr(start + 1, close - start - 1));
    i = close + 1;
  }
}

}  // namespace

std::string expandPrefix(const std::string& tmpl, const PrefixFields& fields) {
  std::string out;
  scanTemplate(
      tmpl, [&](std::string_view text) { out.append(text); },
      [&](const std::string& name) {
        if (name == "rank") out += std::to_string(fields.rank);
        else if (name == "local_rank") out += std::to_string(fields.localRank);
        else if (name == "role" || name == "role_name") out += fields.role;
        else if (name == "host" || name == "hostname") out += fields.host;  // torchrun: ${hostname}
        else throw ConfigError("log line prefix template '" + tmpl + "': unknown field {" + name +
                               "} (use {rank}, {local_rank}, {role}, {host})");
      });
  return out;
}

void validatePrefixTemplate(const std::string& tmpl) { expandPrefix(tmpl, PrefixFields{}); }

}  // namespace ddprun
