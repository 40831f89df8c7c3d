#include "worker_sdk/env.h"

#include <climits>
#include <optional>

#include "common/error.h"
#include "common/strings.h"
#include "common/token_file.h"

extern char** environ;

namespace ddp {

namespace {

using ddprun::ConfigError;
using Vars = std::map<std::string, std::string>;

std::optional<std::string> lookup(const Vars& vars, const std::string& name) {
  auto it = vars.find(name);
  if (it == vars.end()) return std::nullopt;
  return it->second;
}

std::string required(const Vars& vars, const std::string& name) {
  auto value = lookup(vars, name);
  if (!value || ddprun::trim(*value).empty()) {
    throw ConfigError(name + " is not set: is this program running under ddprun or torchrun?");
  }
  return *value;
}

// A non-negative decimal integer no larger than maxValue.
int64_t parseCount(const std::string& name, const std::string& value, int64_t maxValue) {
  auto parsed = ddprun::parseInt(ddprun::trim(value));
  if (!parsed || *parsed < 0) {
    throw ConfigError(name + "='" + value + "' is not a non-negative integer");
  }
  if (*parsed > maxValue) {
    throw ConfigError(name + "=" + value + " is out of range (at most " + std::to_string(maxValue) + ")");
  }
  return *parsed;
}

int requiredInt(const Vars& vars, const std::string& name) {
  return static_cast<int>(parseCount(name, required(vars, name), INT_MAX));
}

int optionalInt(const Vars& vars, const std::string& name, int fallback) {
  auto value = lookup(vars, name);
  if (!value) return fallback;
  return static_cast<int>(parseCount(name, *value, INT_MAX));
}

// `lowerName=lower` must be below `upperName=upper`.
void requireBelow(const std::string& lowerName, int lower, const std::string& upperName, int upper) {
  if (lower >= upper) {
    throw ConfigError(lowerName + "=" + std::to_string(lower) + " must be less than " + upperName + "=" +
                      std::to_string(upper));
  }
}

void requirePositive(const std::string& name, int value) {
  if (value < 1) throw ConfigError(name + "=" + std::to_string(value) + " must be at least 1");
}

std::string readToken(const Vars& vars) {
  if (auto file = lookup(vars, "DDPRUN_RDZV_TOKEN_FILE"); file && !file->empty()) {
    return ddprun::readTokenFile(*file, "DDPRUN_RDZV_TOKEN_FILE");
  }
  return lookup(vars, "DDPRUN_RDZV_TOKEN").value_or("");
}

// "/run/<id>/round/<n>/" -> id and n, checked against what the other variables say.
void applyStorePrefix(const std::string& prefix, Env& env, bool roundGiven) {
  const std::string bad = "DDPRUN_STORE_PREFIX='" + prefix + "' ";
  const std::string marker = "/round/";
  const auto at = prefix.rfind(marker);
  if (!ddprun::startsWith(prefix, "/run/") || !ddprun::endsWith(prefix, "/") || at == std::string::npos ||
      at < 5) {
    throw ConfigError(bad + "is not of the form /run/<id>/round/<n>/");
  }
  const std::string id = prefix.substr(5, at - 5);
  const std::string roundText = prefix.substr(at + marker.size(), prefix.size() - at - marker.size() - 1);
  auto round = ddprun::parseInt(roundText);
  if (id.empty() || !round || *round < 0) throw ConfigError(bad + "is not of the form /run/<id>/round/<n>/");
  if (roundGiven && static_cast<uint64_t>(*round) != env.round) {
    throw ConfigError(bad + "does not match DDPRUN_ROUND=" + std::to_string(env.round));
  }
  if (!env.runId.empty() && env.runId != id) {
    throw ConfigError(bad + "does not match the run id '" + env.runId + "'");
  }
  env.round = static_cast<uint64_t>(*round);
  env.runId = id;
}

}  // namespace

Env Env::fromEnvironment(const Vars& vars) {
  Env env;
  env.worldSize = requiredInt(vars, "WORLD_SIZE");
  requirePositive("WORLD_SIZE", env.worldSize);
  env.rank = requiredInt(vars, "RANK");
  requireBelow("RANK", env.rank, "WORLD_SIZE", env.worldSize);
  env.localWorldSize = requiredInt(vars, "LOCAL_WORLD_SIZE");
  requirePositive("LOCAL_WORLD_SIZE", env.localWorldSize);
  if (env.localWorldSize > env.worldSize) {
    throw ConfigError("LOCAL_WORLD_SIZE=" + std::to_string(env.localWorldSize) +
                      " must not exceed WORLD_SIZE=" + std::to_string(env.worldSize));
  }
  env.localRank = requiredInt(vars, "LOCAL_RANK");
  requireBelow("LOCAL_RANK", env.localRank, "LOCAL_WORLD_SIZE", env.localWorldSize);
  env.groupWorldSize = requiredInt(vars, "GROUP_WORLD_SIZE");
  requirePositive("GROUP_WORLD_SIZE", env.groupWorldSize);
  if (env.groupWorldSize > env.worldSize) {
    throw ConfigError("GROUP_WORLD_SIZE=" + std::to_string(env.groupWorldSize) +
                      " must not exceed WORLD_SIZE=" + std::to_string(env.worldSize));
  }
  env.groupRank = requiredInt(vars, "GROUP_RANK");
  requireBelow("GROUP_RANK", env.groupRank, "GROUP_WORLD_SIZE", env.groupWorldSize);
  env.masterAddr = std::string(ddprun::trim(required(vars, "MASTER_ADDR")));
  env.masterPort = static_cast<int>(parseCount("MASTER_PORT", required(vars, "MASTER_PORT"), 65535));
  requirePositive("MASTER_PORT", env.masterPort);
  env.restartCount = optionalInt(vars, "TORCHELASTIC_RESTART_COUNT", 0);

  const auto round = lookup(vars, "DDPRUN_ROUND");
  if (round) env.round = static_cast<uint64_t>(parseCount("DDPRUN_ROUND", *round, INT64_MAX));
  env.runId = lookup(vars, "DDPRUN_RUN_ID").value_or("");
  if (env.runId.empty()) env.runId = lookup(vars, "TORCHELASTIC_RUN_ID").value_or("");
  env.storeAddr = std::string(ddprun::trim(lookup(vars, "DDPRUN_STORE_ADDR").value_or("")));
  env.storePrefix = lookup(vars, "DDPRUN_STORE_PREFIX").value_or("");
  if (!env.storePrefix.empty()) applyStorePrefix(env.storePrefix, env, round.has_value());
  env.token = readToken(vars);
  env.etcdPrefix = lookup(vars, "DDPRUN_ETCD_PREFIX").value_or("/ddprun");
  env.etcdCaCert = lookup(vars, "DDPRUN_ETCD_CACERT").value_or("");
  env.etcdCert = lookup(vars, "DDPRUN_ETCD_CERT").value_or("");
  env.etcdKey = lookup(vars, "DDPRUN_ETCD_KEY").value_or("");
  env.etcdAuthFile = lookup(vars, "DDPRUN_ETCD_AUTH_FILE").value_or("");
  env.storeTls = lookup(vars, "DDPRUN_STORE_TLS").value_or("") == "1";
  env.storeTlsCaCert = lookup(vars, "DDPRUN_STORE_TLS_CACERT").value_or("");
  env.storeTlsCert = lookup(vars, "DDPRUN_STORE_TLS_CERT").value_or("");
  env.storeTlsKey = lookup(vars, "DDPRUN_STORE_TLS_KEY").value_or("");
  env.heartbeatSocket = lookup(vars, "DDPRUN_HEARTBEAT_SOCKET").value_or("");
  // Not checked here: a value that names no channel leaves heartbeats to the socket (Heartbeat).
  if (auto fd = ddprun::parseInt(lookup(vars, "DDPRUN_HEARTBEAT_FD").value_or("")); fd && *fd >= 0 && *fd <= INT_MAX) {
    env.heartbeatFd = static_cast<int>(*fd);
  }
  env.cudaVisibleDevices = lookup(vars, "CUDA_VISIBLE_DEVICES").value_or("");
  env.glooSocketIfname = lookup(vars, "GLOO_SOCKET_IFNAME").value_or("");
  return env;
}

Env Env::fromEnviron() {
  Vars vars;
  for (char** entry = environ; entry && *entry; ++entry) {
    std::string_view text(*entry);
    const auto eq = text.find('=');
    if (eq == std::string_view::npos) continue;
    vars.emplace(std::string(text.substr(0, eq)), std::string(text.substr(eq + 1)));
  }
  return fromEnvironment(vars);
}

}  // namespace ddp
