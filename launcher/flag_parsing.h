// Parsers for one flag's value each. Pure (only --rdzv_conf's token_file looks at the file
// system); each throws ConfigError naming the flag, the value as typed and what was expected.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "launcher/launch_config.h"

namespace ddprun {

struct IntRange {
  int64_t min;
  int64_t max;
};

struct SecondsRange {
  double min = 0;
  double max = std::numeric_limits<double>::infinity();
};

struct NodeRange {
  int min = 1;
  int max = 1;
};

// The range of each numeric flag, documented here and checked nowhere else.
inline constexpr IntRange kMasterPortRange{1, 65535};
inline constexpr IntRange kMaxRestartsRange{0, 1000000};
inline constexpr int kMaxNodeCount = 100000;  // --nnodes
// Durations are bounded so that no conversion to milliseconds or microseconds can overflow, and
// so that a typo (1e12, 0.000001) is an error at once rather than a run that fails later.
inline constexpr SecondsRange kMonitorIntervalRange{0, 3600};
inline constexpr SecondsRange kShutdownTimeoutRange{0, 86400};
inline constexpr SecondsRange kHangTimeoutRange{0, 86400};          // 0: off
inline constexpr SecondsRange kFinishTimeoutRange{0, 86400};        // 0: off
inline constexpr SecondsRange kJoinTimeoutRange{1, 604800};         // --rdzv_conf join_timeout (a week)
inline constexpr SecondsRange kLastCallTimeoutRange{0, 3600};       // --rdzv_conf last_call_timeout
inline constexpr SecondsRange kCloseTimeoutRange{0, 3600};          // --rdzv_conf close_timeout
inline constexpr SecondsRange kHeartbeatTimeoutRange{0.5, 3600};    // --rdzv_conf heartbeat_timeout

constexpr int kDefaultRendezvousPort = 29400;

// Every flag's value as read, before its parser sees it; free text (a host, a folder, a name)
// needs nothing more. A rule for all values (such as "--x is not a value") is one line here.
std::string parseText(std::string_view flag, const std::string& value);

// A whole decimal integer within `range`, surrounding blanks allowed.
int parseIntFlag(std::string_view flag, const std::string& value, IntRange range);

// A number of seconds within `range` ("30", "0.5"), surrounding blanks allowed.
double parseSecondsFlag(std::string_view flag, const std::string& value, SecondsRange range);

// --nnodes: N, or MIN:MAX for an elastic job.
NodeRange parseNnodes(const std::string& value);

// --signals_to_handle: comma-separated names, with or without SIG (SIGTERM, HUP); not KILL,
// STOP or CHLD, which ddprun cannot forward.
std::vector<int> parseSignals(const std::string& value);

// --start_method: accepted for torchrun compatibility; ddprun always execs.
void checkStartMethod(const std::string& value);

// --logs_specs: torchrun loads a Python entry point by that name; ddprun has only its built-in
// logs spec, which torch registers as "default": that name is accepted, any other is refused
// (torchrun refuses names it cannot find too).
void checkLogsSpecs(const std::string& value);

// --event_log_handler: "null" (torchrun's default; "dynamic_rendezvous" means the same) or
// "console" (JSON lines on ddprun's stderr). Returns "null" or "console".
std::string parseEventLogHandler(const std::string& value);

// --recovery: restart (false) or in_process (true).
bool parseRecovery(const std::string& value);

// --torch_store: auto, agent or rank0 (any case).
LaunchConfig::TorchStoreMode parseTorchStore(const std::string& value);

// --numa_binding: "" (off), node, socket, exclusive or core-complex, as torchrun's.
std::string parseNumaBinding(const std::string& value);

// --legacy_local_rank: "" (none), "underscore" (--local_rank, torch.distributed.launch before torch
// 2.0) or "dash" (--local-rank, 2.0 and later). Returns the flag to pass, or "".
std::string parseLegacyLocalRank(const std::string& value);

// --rdzv_backend: static, grpc (torchrun's c10d is an alias), etcd (etcd-v2, torch's name, too).
RdzvBackend parseRdzvBackend(const std::string& value);

// --rdzv_conf KEY=VALUE,...: sets cfg's rendezvous timeouts, TLS, isHost and tokenFile from
// torchrun's keys (every backend's, 1.13 and 2.x) and ddprun's. A value quoted as a whole counts
// without its quotes. A bad value is a ConfigError naming its key; an unknown key is not an error
// (torchrun goes on too) but comes back as a warning naming the closest known key.
std::vector<std::string> parseRendezvousConf(const std::string& text, LaunchConfig& cfg);

}  // namespace ddprun
