#include "launcher/flag_parsing.h"

#include <signal.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>  // sigabbrev_np
#include <optional>
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

bool parseRecovery(const std::string& value) {
  const std::string v(trim(value));
  if (v == "restart" || v.empty()) return false;
  if (v == "in_process") return true;
  throw ConfigError(quoted("--recovery", value) + ": expected restart or in_process");
}

LaunchConfig::TorchStoreMode parseTorchStore(const std::string& value) {
  std::string v(trim(value));
  for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (v == "auto" || v.empty()) return LaunchConfig::TorchStoreMode::kAuto;
  if (v == "agent") return LaunchConfig::TorchStoreMode::kAgent;
  if (v == "rank0") return LaunchConfig::TorchStoreMode::kRank0;
  throw ConfigError(quoted("--torch_store", value) + ": expected auto, agent or rank0");
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

namespace {

// torchrun's --rdzv_conf keys, from its backends (c10d, etcd, etcd-v2, static) in torch 1.13 and
// 2.x, and ddprun's own. README "--rdzv_conf" says what each does here; one list, for the parser
// and for the closest-key hint.
constexpr std::string_view kConfKeys[] = {
    // torchrun's dynamic rendezvous (c10d, etcd-v2)
    "join_timeout", "last_call_timeout", "close_timeout", "heartbeat_timeout", "keep_alive_interval",
    "keep_alive_max_attempt",
    // torchrun's c10d store and its static backend
    "is_host", "read_timeout", "store_type", "use_libuv", "timeout", "rank",
    // torchrun's etcd (v1) and etcd-v2 backends
    "protocol", "cacert", "cert", "key", "ca_cert", "ssl_cert", "ssl_cert_key", "etcd_prefix",
    // ddprun's own
    "token_file", "server_cert", "server_key", "auth_file"};

// Levenshtein distance, for "did you mean": keys are short, so the quadratic table is nothing.
std::size_t editDistance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string_view closestConfKey(std::string_view key) {
  std::string_view best = kConfKeys[0];
  for (auto known : kConfKeys) {
    if (editDistance(key, known) < editDistance(key, best)) best = known;
  }
  return best;
}

// torch's get_as_bool: 1/true/t/yes/y and 0/false/f/no/n, any case.
bool parseConfBoolKey(const std::string& key, const std::string& value) {
  std::string v = lowered(value);
  if (v == "1" || v == "true" || v == "t" || v == "yes" || v == "y") return true;
  if (v == "0" || v == "false" || v == "f" || v == "no" || v == "n") return false;
  throw ConfigError(quoted("--rdzv_conf " + key, value) + ": expected 1/0, true/false");
}

// A value quoted as a whole ('a=1,b=2', as PyTorch's own tests pass it with no shell to remove
// the quotes): the quotes are not part of what the user meant.
std::string_view unquoted(std::string_view text) {
  text = trim(text);
  // Only a pair that encloses the whole: in "a=1",b="2" the first and last quotes are not a pair.
  while (text.size() >= 2 && (text.front() == '\'' || text.front() == '"') && text.back() == text.front() &&
         text.substr(1, text.size() - 2).find(text.front()) == std::string_view::npos) {
    text = trim(text.substr(1, text.size() - 2));
  }
  return text;
}

}  // namespace

std::vector<std::string> parseRendezvousConf(const std::string& text, LaunchConfig& cfg) {
  std::vector<std::string> warnings;
  std::optional<double> timeout, keepAliveInterval;
  std::optional<long long> keepAliveAttempts;
  bool joinGiven = false, heartbeatGiven = false;
  for (const auto& item : split(std::string(unquoted(text)), ',')) {
    std::string pair(unquoted(item));
    if (pair.empty()) continue;
    auto eq = pair.find('=');
    if (eq == std::string::npos) throw ConfigError(quoted("--rdzv_conf", text) + ": expected KEY=VALUE pairs");
    std::string key(unquoted(pair.substr(0, eq)));
    std::string value(unquoted(pair.substr(eq + 1)));
    std::string flag = "--rdzv_conf " + key;
    if (key == "join_timeout") {
      cfg.joinTimeoutSeconds = parseSecondsFlag(flag, value, kJoinTimeoutRange);
      joinGiven = true;
    } else if (key == "timeout") {
      // torch's etcd (v1) and static backends: the time to form the rendezvous, join_timeout's meaning.
      timeout = parseSecondsFlag(flag, value, kJoinTimeoutRange);
    } else if (key == "last_call_timeout") {
      cfg.lastCallTimeoutSeconds = parseSecondsFlag(flag, value, kLastCallTimeoutRange);
    } else if (key == "close_timeout") {
      cfg.closeTimeoutSeconds = parseSecondsFlag(flag, value, kCloseTimeoutRange);
    } else if (key == "heartbeat_timeout") {
      cfg.heartbeatTimeoutSeconds = parseSecondsFlag(flag, value, kHeartbeatTimeoutRange);
      heartbeatGiven = true;
    } else if (key == "keep_alive_interval") {
      keepAliveInterval = parseSecondsFlag(flag, value, kHeartbeatTimeoutRange);
    } else if (key == "keep_alive_max_attempt") {
      keepAliveAttempts = parseIntFlag(flag, value, IntRange{1, 1000});
    } else if (key == "is_host") {
      cfg.isHost = parseConfBoolKey(key, value);
    } else if (key == "use_libuv") {
      parseConfBoolKey(key, value);  // torch's store backend; ddprun's store has its own loop
    } else if (key == "read_timeout") {
      // torch's store client's read timeout. ddprun's rendezvous calls carry deadlines derived
      // from heartbeat_timeout, so a dead peer is found at that pace; checked, no effect.
      parseSecondsFlag(flag, value, kJoinTimeoutRange);
    } else if (key == "store_type") {
      if (lowered(value) != "tcp" && lowered(value) != "file") throw ConfigError(quoted(flag, value) + ": expected tcp or file");
    } else if (key == "rank") {
      parseIntFlag(flag, value, IntRange{0, kMaxNodeCount - 1});  // torch's static backend; --node_rank decides
    } else if (key == "token_file") {
      readTokenFile(value, "--rdzv_conf token_file");  // checked now: a bad file is exit 2 at once
      cfg.tokenFile = value;
    } else if (key == "protocol") {
      if (lowered(value) != "http" && lowered(value) != "https") throw ConfigError("--rdzv_conf protocol: expected http or https");
      cfg.tls = lowered(value) == "https";
    } else if (key == "cacert" || key == "ca_cert") {  // ca_cert, ssl_cert, ssl_cert_key: etcd-v2's names
      cfg.tlsCaCert = value;
    } else if (key == "cert" || key == "ssl_cert") {
      cfg.tlsCert = value;
    } else if (key == "key" || key == "ssl_cert_key") {
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
    } else {
      // torchrun goes on past a key no backend reads (silently); so does ddprun, but says so.
      warnings.push_back("--rdzv_conf: unknown key '" + key + "' ignored (did you mean '" +
                         std::string(closestConfKey(key)) + "'?)");
    }
  }
  if (timeout && !joinGiven) cfg.joinTimeoutSeconds = *timeout;
  // torch's dynamic rendezvous declares a node dead after keep_alive_max_attempt missed beats
  // keep_alive_interval apart (5 s x 3); ddprun's heartbeat_timeout is that product.
  if ((keepAliveInterval || keepAliveAttempts) && !heartbeatGiven) {
    double product = keepAliveInterval.value_or(5.0) * static_cast<double>(keepAliveAttempts.value_or(3));
    cfg.heartbeatTimeoutSeconds = std::min(product, kHeartbeatTimeoutRange.max);
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
  return warnings;
}

}  // namespace ddprun
