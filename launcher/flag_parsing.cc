#include "launcher/flag_parsing.h"

#include <signal.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>  // sigabbrev_np
#include <set>
#include <sstream>

#include "common/error.h"
#include "common/strings.h"
#include "common/token_file.h"

namespace ddprun {
namespace {

std::string quoted(std::string_view flag, const std::string& value) {
  return std::string(flag) + " '" + value + "'";
}

std::string secondsText(double seconds) {
  std::ostringstream out;
  out << seconds;
  return out.str();
}

std::string lowered(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

bool parseConfBool(const std::string& value) {
  std::string v = lowered(value);
  if (v == "1" || v == "true" || v == "yes") return true;
  if (v == "0" || v == "false" || v == "no") return false;
  throw ConfigError(quoted("--rdzv_conf is_host", value) + ": expected 1/0, true/false");
}

}  // namespace

std::string parseText(std::string_view /*flag*/, const std::string& value) { return value; }

int parseIntFlag(std::string_view flag, const std::string& value, IntRange range) {
  auto n = parseInt(trim(value));
  if (!n || *n < range.min || *n > range.max) {
    throw ConfigError(quoted(flag, value) + ": expected an integer from " + std::to_string(range.min) + " to " +
                      std::to_string(range.max));
  }
  return static_cast<int>(*n);
}

double parseSecondsFlag(std::string_view flag, const std::string& value, SecondsRange range) {
  auto s = parseSeconds(trim(value));
  if (s && *s >= range.min && *s <= range.max) return *s;
  if (range.min == 0 && std::isinf(range.max)) {
    throw ConfigError(quoted(flag, value) + ": expected a non-negative number of seconds");
  }
  throw ConfigError(quoted(flag, value) + ": expected a number of seconds from " + secondsText(range.min) + " to " +
                    secondsText(range.max));
}

NodeRange parseNnodes(const std::string& value) {
  auto parts = split(value, ':');
  if (parts.size() > 2) throw ConfigError(quoted("--nnodes", value) + ": expected N or MIN:MAX");
  auto min = parseInt(trim(parts[0]));
  auto max = parts.size() == 2 ? parseInt(trim(parts[1])) : min;
  if (!min || !max || *min < 1 || *max < 1 || *max > kMaxNodeCount) {
    throw ConfigError(quoted("--nnodes", value) + ": node counts must be positive integers (N or MIN:MAX)");
  }
  if (*min > *max) throw ConfigError(quoted("--nnodes", value) + ": MIN is larger than MAX");
  return NodeRange{static_cast<int>(*min), static_cast<int>(*max)};
}

std::vector<int> parseSignals(const std::string& value) {
  std::vector<int> sigs;
  for (const auto& part : split(value, ',')) {
    std::string name(trim(part));
    if (name.empty()) continue;
    std::string bare = startsWith(name, "SIG") ? name.substr(3) : name;
    int sig = 0;
    for (int s = 1; s < NSIG; ++s) {
      const char* abbrev = ::sigabbrev_np(s);
      if (abbrev && bare == abbrev) sig = s;
    }
    if (sig == 0 || sig == SIGKILL || sig == SIGSTOP || sig == SIGCHLD) {
      throw ConfigError(quoted("--signals_to_handle", value) + ": '" + name + "' is not a signal ddprun can handle");
    }
    sigs.push_back(sig);
  }
  return sigs;
}

void checkStartMethod(const std::string& value) {
  if (value != "spawn" && value != "fork" && value != "forkserver") {
    throw ConfigError(quoted("--start_method", value) + ": expected spawn, fork or forkserver");
  }
}

void checkLogsSpecs(const std::string& value) {
  if (value.empty() || value == "default") return;
  throw ConfigError(quoted("--logs_specs", value) +
                    ": custom logs specs are torchrun plugins (Python entry points of group torchrun.logs_specs), "
                    "which ddprun cannot load; its built-in one (\"default\", as torch names it) takes --log_dir, --redirects, --tee and "
                    "--local_ranks_filter");
}

std::string parseEventLogHandler(const std::string& value) {
  if (value == "null" || value == "dynamic_rendezvous" || value.empty()) return "null";
  if (value == "console") return "console";
  throw ConfigError(quoted("--event_log_handler", value) + ": expected null, console or dynamic_rendezvous");
}

std::string parseNumaBinding(const std::string& value) {
  if (value.empty() || value == "node" || value == "socket" || value == "exclusive" || value == "core-complex") {
    return value;
  }
  throw ConfigError(quoted("--numa_binding", value) + ": expected node, socket, exclusive or core-complex");
}

std::string parseLegacyLocalRank(const std::string& value) {
  if (value.empty()) return "";
  if (value == "underscore") return "--local_rank";
  if (value == "dash") return "--local-rank";
  throw ConfigError(quoted("--legacy_local_rank", value) + ": expected underscore or dash");
}

RdzvBackend parseRdzvBackend(const std::string& value) {
  if (value == "static") return RdzvBackend::kStatic;
  if (value == "grpc" || value == "c10d") return RdzvBackend::kGrpc;
  // torch's etcd-v2 backend is the same idea on etcd's v3 API; both names mean ours.
  if (value == "etcd" || value == "etcd-v2") return RdzvBackend::kEtcd;
  throw ConfigError(quoted("--rdzv_backend", value) + ": expected static, grpc, c10d, etcd or etcd-v2");
}

const char* backendName(RdzvBackend backend) {
  switch (backend) {
    case RdzvBackend::kStatic: return "static";
    case RdzvBackend::kGrpc: return "grpc";
    case RdzvBackend::kEtcd: return "etcd";
  }
  return "static";
}

void parseRendezvousConf(const std::string& text, LaunchConfig& cfg) {
  static const std::set<std::string> ignored = {"close_timeout", "timeout", "read_timeout", "keep_alive_interval",
                                                "keep_alive_max_attempt", "store_type", "use_libuv"};
  for (const auto& item : split(text, ',')) {
    if (trim(item).empty()) continue;
    auto eq = item.find('=');
    if (eq == std::string::npos) throw ConfigError(quoted("--rdzv_conf", text) + ": expected KEY=VALUE pairs");
    std::string key(trim(item.substr(0, eq)));
    std::string value(trim(item.substr(eq + 1)));
    if (key == "join_timeout") {
      cfg.joinTimeoutSeconds = parseSecondsFlag("--rdzv_conf join_timeout", value, kJoinTimeoutRange);
    } else if (key == "last_call_timeout") {
      cfg.lastCallTimeoutSeconds = parseSecondsFlag("--rdzv_conf last_call_timeout", value, kLastCallTimeoutRange);
    } else if (key == "heartbeat_timeout") {
      cfg.heartbeatTimeoutSeconds = parseSecondsFlag("--rdzv_conf heartbeat_timeout", value, kHeartbeatTimeoutRange);
    } else if (key == "is_host") {
      cfg.isHost = parseConfBool(value);
    } else if (key == "token_file") {
      readTokenFile(value, "--rdzv_conf token_file");  // checked now: a bad file is exit 2 at once
      cfg.tokenFile = value;
    } else if (key == "protocol") {
      if (value != "http" && value != "https") throw ConfigError("--rdzv_conf protocol: expected http or https");
      cfg.tls = value == "https";
    } else if (key == "cacert") {
      cfg.tlsCaCert = value;
    } else if (key == "cert") {
      cfg.tlsCert = value;
    } else if (key == "key") {
      cfg.tlsKey = value;
    } else if (key == "server_cert") {
      cfg.tlsServerCert = value;
    } else if (key == "server_key") {
      cfg.tlsServerKey = value;
    } else if (key == "etcd_prefix") {
      if (value.empty() || value[0] != '/') throw ConfigError("--rdzv_conf etcd_prefix: expected a key path starting with /");
      cfg.etcdPrefix = value;
    } else if (key == "auth_file") {
      readTokenFile(value, "--rdzv_conf auth_file");  // checked now: a bad file is exit 2 at once
      cfg.etcdAuthFile = value;
    } else if (!ignored.count(key)) {
      throw ConfigError("--rdzv_conf: unknown key '" + key +
                        "' (known: join_timeout, last_call_timeout, heartbeat_timeout, is_host, token_file, "
                        "protocol, cacert, cert, key, server_cert, server_key, and for etcd etcd_prefix, auth_file)");
    }
  }
  if (cfg.tlsCert.empty() != cfg.tlsKey.empty()) {
    throw ConfigError("--rdzv_conf: cert and key go together (this node's certificate and its key)");
  }
  if (cfg.tlsServerCert.empty() != cfg.tlsServerKey.empty()) {
    throw ConfigError("--rdzv_conf: server_cert and server_key go together");
  }
  if (!cfg.tls && (!cfg.tlsCaCert.empty() || !cfg.tlsCert.empty() || !cfg.tlsServerCert.empty())) {
    throw ConfigError("--rdzv_conf: cacert, cert and server_cert need protocol=https (else they would be ignored "
                      "and the rendezvous would go in clear)");
  }
  if (cfg.joinTimeoutSeconds <= 0 || cfg.heartbeatTimeoutSeconds <= 0) {
    throw ConfigError("--rdzv_conf: join_timeout and heartbeat_timeout must be positive");
  }
}

}  // namespace ddprun
