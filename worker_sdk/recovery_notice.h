// The agent's notices on the worker's channel (docs/heartbeat.md, "Notices (agent to worker)"):
// with ddprun --recovery=in_process a live worker is told its place in the next round by one
// datagram on its end of the heartbeat channel (DDPRUN_HEARTBEAT_FD):
//
//   recover round=R restart=C rank=N world=W local_rank=L master_addr=A master_port=P
//           [env.NAME=VALUE ...] reason=TEXT
//
// The bytes come from another process: parsing is strict and bounded, and nothing in a notice
// can crash the worker. The Python side (python/ddprun/recovery.py, _parse_notice) reads the same.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "worker_sdk/env.h"

namespace ddp {

// A notice is one datagram of at most this many bytes (the agent cuts its own at 1024).
inline constexpr std::size_t kMaxRecoveryNotice = 1024;
// At most this many env.NAME=VALUE tokens are kept, and each NAME and VALUE at most this long:
// the agent sends a handful of at most 256 bytes each.
inline constexpr std::size_t kMaxRecoveryNoticeEnv = 32;
inline constexpr std::size_t kMaxRecoveryNoticeEnvName = 64;
inline constexpr std::size_t kMaxRecoveryNoticeEnvValue = 256;

struct RecoveryNotice {
  uint64_t round = 0;      // the new round (DDPRUN_ROUND)
  int restart = 0;         // TORCHELASTIC_RESTART_COUNT
  int rank = 0;            // RANK in the new round (ranks may be renumbered)
  int world = 1;           // WORLD_SIZE
  int localRank = 0;       // LOCAL_RANK
  std::string masterAddr;  // MASTER_ADDR
  int masterPort = 0;      // MASTER_PORT
  // env.NAME=VALUE tokens in the order sent: DDPRUN_STORE_ADDR and DDPRUN_STORE_PREFIX (ddprun's
  // store of the new round), and for a warm spare the rest of its contract.
  std::vector<std::pair<std::string, std::string>> env;
  std::string reason;  // why the round changed, for the log; may be empty

  // The value of env.NAME, or nullopt when the notice has none.
  std::optional<std::string> envValue(std::string_view name) const;
};

// Parses one message of the channel. nullopt for a message that is not a notice (another leading
// keyword: a later protocol's) and for a malformed one: over kMaxRecoveryNotice bytes, a byte
// that is not printable ASCII, a token without '=', a key twice, a required key missing, a number
// out of range, rank >= world, too many or too long env tokens. `why`, when given, says which.
// Unknown keys are skipped (the agent may add some); "reason=" takes the rest of the message.
std::optional<RecoveryNotice> parseRecoveryNotice(std::string_view message, std::string* why = nullptr);

// The environment of the new round: `current` with the notice's rank, world size, local rank,
// master, restart count and round, and its env tokens that libddp reads (DDPRUN_STORE_ADDR,
// DDPRUN_STORE_PREFIX, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, CUDA_VISIBLE_DEVICES),
// checked as Env::fromEnvironment checks a launch (a store prefix of another round or run is a
// ddprun::ConfigError). Without env.LOCAL_WORLD_SIZE the local world size is kept, widened to
// hold the new local rank and narrowed to the new world; groups likewise. A round with no store
// of its own keeps the current one's address, with the prefix cleared (it named the old round).
Env applyRecoveryNotice(const Env& current, const RecoveryNotice& notice);

// The environment of a warm spare (ddprun --spares_per_node) that `notice` makes a rank: the
// process's own variables `vars` (a spare has none of a rank's: RANK, LOCAL_WORLD_SIZE, ...) with
// the notice's fields and its env tokens (env.LOCAL_WORLD_SIZE, env.GROUP_RANK, ...), checked as
// Env::fromEnvironment checks a launch; ddprun::ConfigError when they do not make a rank's.
Env spareRecoveryEnv(const std::map<std::string, std::string>& vars, const RecoveryNotice& notice);

struct NoticeReaderOptions {
  // The worker's end of the channel (DDPRUN_HEARTBEAT_FD). Duplicated: the reader never closes
  // the caller's descriptor. -1, or a descriptor that is no unix packet socket: no notices.
  int fd = -1;
  // The round this process is in (DDPRUN_ROUND): a notice not above it is stale and dropped.
  uint64_t currentRound = 0;
};

// Reads notices on the channel the Heartbeat writes beats on (a SOCK_SEQPACKET pair carries both
// directions). Never blocks beyond the timeout it is given. One thread at a time.
class NoticeReader {
 public:
  explicit NoticeReader(NoticeReaderOptions options);
  ~NoticeReader();
  NoticeReader(const NoticeReader&) = delete;
  NoticeReader& operator=(const NoticeReader&) = delete;

  // Whether notices can still come: a channel, not at end-of-file (the agent gone), read by the
  // process that opened the reader (a forked child holds the descriptor too, and must not take a
  // notice meant for its parent).
  bool available() const;

  // The newest valid notice pending now, or nullopt; never blocks. Reads every pending message:
  // malformed, stale and foreign ones are dropped (counted in dropped()).
  std::optional<RecoveryNotice> poll();

  // Waits up to `timeout` for a notice, then returns the newest pending. Returns at once when
  // one is pending or the channel is closed.
  std::optional<RecoveryNotice> wait(std::chrono::milliseconds timeout);

  // After applying a notice: later ones must be above its round.
  void setCurrentRound(uint64_t round) { currentRound_ = round; }
  uint64_t currentRound() const { return currentRound_; }

  // Messages dropped so far (malformed, stale, not notices), and why the last one was.
  std::size_t dropped() const { return dropped_; }
  const std::string& lastDropReason() const { return lastDropReason_; }

 private:
  // Takes every pending message; returns the newest valid notice among them.
  std::optional<RecoveryNotice> drain();
  void drop(std::string why);

  int fd_ = -1;
  int pid_ = -1;  // the process that opened it
  bool closed_ = false;
  uint64_t currentRound_ = 0;
  std::size_t dropped_ = 0;
  std::string lastDropReason_;
};

}  // namespace ddp
