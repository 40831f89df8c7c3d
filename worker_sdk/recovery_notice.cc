#include "worker_sdk/recovery_notice.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>

#include "common/strings.h"

namespace ddp {

namespace {

constexpr std::string_view kKeyword = "recover";
constexpr std::string_view kReason = "reason=";
// The env tokens applyRecoveryNotice takes: what libddp's Env reads of a rank's contract. The
// rest (TORCHELASTIC_ERROR_FILE, ROLE_*) is for torch's side and kept in RecoveryNotice::env.
constexpr std::string_view kAppliedEnv[] = {"DDPRUN_STORE_ADDR", "DDPRUN_STORE_PREFIX", "LOCAL_WORLD_SIZE",
                                            "GROUP_RANK", "GROUP_WORLD_SIZE", "CUDA_VISIBLE_DEVICES"};

std::optional<RecoveryNotice> malformed(std::string* why, std::string text) {
  if (why) *why = std::move(text);
  return std::nullopt;
}

bool printableAscii(std::string_view text) {
  return std::all_of(text.begin(), text.end(), [](char c) { return c >= 0x20 && c < 0x7f; });
}

// A decimal number of at most `digits` digits, no sign, within [low, high].
std::optional<int64_t> number(std::string_view text, std::size_t digits, int64_t low, int64_t high) {
  if (text.empty() || text.size() > digits) return std::nullopt;
  if (!std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
  auto value = ddprun::parseInt(text);
  if (!value || *value < low || *value > high) return std::nullopt;
  return value;
}

bool envName(std::string_view name) {
  if (name.empty() || name.size() > kMaxRecoveryNoticeEnvName) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

}  // namespace

std::optional<std::string> RecoveryNotice::envValue(std::string_view name) const {
  for (const auto& [key, value] : env) {
    if (key == name) return value;
  }
  return std::nullopt;
}

std::optional<RecoveryNotice> parseRecoveryNotice(std::string_view message, std::string* why) {
  if (message.size() > kMaxRecoveryNotice) {
    return malformed(why, "notice of " + std::to_string(message.size()) + " bytes, over " +
                              std::to_string(kMaxRecoveryNotice));
  }
  // The agent writes no line end; a final LF is tolerated, as on heartbeats.
  while (!message.empty() && (message.back() == '\n' || message.back() == ' ')) message.remove_suffix(1);
  if (!printableAscii(message)) return malformed(why, "notice holds bytes that are not printable ASCII");
  const auto space = message.find(' ');
  if (message.substr(0, space) != kKeyword) return malformed(why, "not a notice (no leading \"recover\")");
  std::string_view rest = space == std::string_view::npos ? std::string_view() : message.substr(space + 1);

  RecoveryNotice notice;
  // Required keys, each once; values live in `message`.
  std::map<std::string_view, std::string_view> fields;
  while (!rest.empty()) {
    const auto end = rest.find(' ');
    const std::string_view token = rest.substr(0, end);
    rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 1);
    if (token.empty()) return malformed(why, "two spaces in a row");
    if (token.substr(0, kReason.size()) == kReason) {
      // The reason runs to the end, spaces included: it is the last key.
      const std::size_t at = static_cast<std::size_t>(token.data() - message.data()) + kReason.size();
      notice.reason = std::string(message.substr(at));
      break;
    }
    const auto eq = token.find('=');
    if (eq == std::string_view::npos || eq == 0) {
      return malformed(why, "token '" + ddprun::printable(token, 64) + "' is not key=value");
    }
    const std::string_view key = token.substr(0, eq);
    const std::string_view value = token.substr(eq + 1);
    if (key.substr(0, 4) == "env.") {
      const std::string_view name = key.substr(4);
      if (!envName(name)) return malformed(why, "env name '" + ddprun::printable(name, 64) + "' is not [A-Za-z0-9_]{1,64}");
      if (value.size() > kMaxRecoveryNoticeEnvValue) {
        return malformed(why, "env." + std::string(name) + " is over " + std::to_string(kMaxRecoveryNoticeEnvValue) +
                                  " bytes");
      }
      if (notice.envValue(name)) return malformed(why, "env." + std::string(name) + " given twice");
      if (notice.env.size() == kMaxRecoveryNoticeEnv) return malformed(why, "too many env tokens");
      notice.env.emplace_back(std::string(name), std::string(value));
      continue;
    }
    if (!fields.emplace(key, value).second) {
      return malformed(why, "key '" + ddprun::printable(key, 64) + "' given twice");
    }
  }

  for (const char* key : {"round", "restart", "rank", "world", "local_rank", "master_addr", "master_port"}) {
    if (!fields.count(key)) return malformed(why, std::string("missing ") + key + "=");
  }
  constexpr int64_t kIntMax = 2147483647;
  // Rounds are 64-bit in Env; 18 digits keep them within int64 without overflow checks.
  const auto round = number(fields["round"], 18, 0, INT64_MAX);
  const auto restart = number(fields["restart"], 10, 0, kIntMax);
  const auto rank = number(fields["rank"], 10, 0, kIntMax);
  const auto world = number(fields["world"], 10, 1, kIntMax);
  const auto localRank = number(fields["local_rank"], 10, 0, kIntMax);
  const auto port = number(fields["master_port"], 5, 1, 65535);
  if (!round) return malformed(why, "round is not a number");
  if (!restart) return malformed(why, "restart is not a number");
  if (!rank) return malformed(why, "rank is not a number");
  if (!world) return malformed(why, "world is not a number of at least 1");
  if (!localRank) return malformed(why, "local_rank is not a number");
  if (!port) return malformed(why, "master_port is not a port (1 to 65535)");
  if (*rank >= *world) {
    return malformed(why, "rank " + std::to_string(*rank) + " not in a world of " + std::to_string(*world));
  }
  if (fields["master_addr"].empty()) return malformed(why, "master_addr is empty");
  notice.round = static_cast<uint64_t>(*round);
  notice.restart = static_cast<int>(*restart);
  notice.rank = static_cast<int>(*rank);
  notice.world = static_cast<int>(*world);
  notice.localRank = static_cast<int>(*localRank);
  notice.masterAddr = std::string(fields["master_addr"]);
  notice.masterPort = static_cast<int>(*port);
  return notice;
}

namespace {

// `vars` with the notice's rank variables and the env tokens libddp reads, parsed as a launch's.
Env withNotice(std::map<std::string, std::string> vars, const RecoveryNotice& notice) {
  vars["RANK"] = std::to_string(notice.rank);
  vars["WORLD_SIZE"] = std::to_string(notice.world);
  vars["LOCAL_RANK"] = std::to_string(notice.localRank);
  vars["MASTER_ADDR"] = notice.masterAddr;
  vars["MASTER_PORT"] = std::to_string(notice.masterPort);
  vars["TORCHELASTIC_RESTART_COUNT"] = std::to_string(notice.restart);
  vars["DDPRUN_ROUND"] = std::to_string(notice.round);
  // The old round's prefix names the old round: the notice's, or none (the round's number and the
  // run id still scope the store's keys).
  vars.erase("DDPRUN_STORE_PREFIX");
  for (const auto& [name, value] : notice.env) {
    if (std::find(std::begin(kAppliedEnv), std::end(kAppliedEnv), name) != std::end(kAppliedEnv)) {
      vars[name] = value;
    }
  }
  return Env::fromEnvironment(vars);
}

}  // namespace

Env applyRecoveryNotice(const Env& current, const RecoveryNotice& notice) {
  // Re-parsed as a launch's environment, so that a notice is held to the checks a start is.
  std::map<std::string, std::string> vars;
  const auto set = [&](const char* name, const std::string& value) { vars[name] = value; };
  const auto setInt = [&](const char* name, int64_t value) { vars[name] = std::to_string(value); };
  const int localWorld = std::min(notice.world, std::max(current.localWorldSize, notice.localRank + 1));
  const int groupWorld = std::min(notice.world, current.groupWorldSize);
  setInt("LOCAL_WORLD_SIZE", localWorld);
  setInt("GROUP_RANK", std::min(current.groupRank, groupWorld - 1));
  setInt("GROUP_WORLD_SIZE", groupWorld);
  if (!current.runId.empty()) set("DDPRUN_RUN_ID", current.runId);
  if (!current.storeAddr.empty()) set("DDPRUN_STORE_ADDR", current.storeAddr);
  if (!current.token.empty()) set("DDPRUN_RDZV_TOKEN", current.token);
  set("DDPRUN_ETCD_PREFIX", current.etcdPrefix);
  set("DDPRUN_ETCD_CACERT", current.etcdCaCert);
  set("DDPRUN_ETCD_CERT", current.etcdCert);
  set("DDPRUN_ETCD_KEY", current.etcdKey);
  set("DDPRUN_ETCD_AUTH_FILE", current.etcdAuthFile);
  if (current.storeTls) set("DDPRUN_STORE_TLS", "1");
  set("DDPRUN_STORE_TLS_CACERT", current.storeTlsCaCert);
  set("DDPRUN_STORE_TLS_CERT", current.storeTlsCert);
  set("DDPRUN_STORE_TLS_KEY", current.storeTlsKey);
  if (current.heartbeatFd >= 0) setInt("DDPRUN_HEARTBEAT_FD", current.heartbeatFd);
  if (!current.heartbeatSocket.empty()) set("DDPRUN_HEARTBEAT_SOCKET", current.heartbeatSocket);
  if (!current.cudaVisibleDevices.empty()) set("CUDA_VISIBLE_DEVICES", current.cudaVisibleDevices);
  if (!current.glooSocketIfname.empty()) set("GLOO_SOCKET_IFNAME", current.glooSocketIfname);
  return withNotice(std::move(vars), notice);
}

Env spareRecoveryEnv(const std::map<std::string, std::string>& vars, const RecoveryNotice& notice) {
  auto own = vars;
  own.erase("DDPRUN_SPARE");
  return withNotice(std::move(own), notice);
}

NoticeReader::NoticeReader(NoticeReaderOptions options) : currentRound_(options.currentRound) {
  if (options.fd < 0) return;
  // Only the channel: the same number in a process that did not inherit it may be any file.
  int type = 0, domain = 0;
  socklen_t len = sizeof(type);
  if (::getsockopt(options.fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_SEQPACKET) return;
  len = sizeof(domain);
  if (::getsockopt(options.fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0 || domain != AF_UNIX) return;
  fd_ = ::fcntl(options.fd, F_DUPFD_CLOEXEC, 3);
  pid_ = static_cast<int>(::getpid());
}

bool NoticeReader::available() const { return fd_ >= 0 && !closed_ && pid_ == static_cast<int>(::getpid()); }

NoticeReader::~NoticeReader() {
  if (fd_ >= 0) ::close(fd_);
}

void NoticeReader::drop(std::string why) {
  ++dropped_;
  lastDropReason_ = std::move(why);
}

std::optional<RecoveryNotice> NoticeReader::drain() {
  std::optional<RecoveryNotice> latest;
  uint64_t latestRound = 0;
  // One byte over the bound tells an oversized message from one that fits; MSG_TRUNC gives the
  // real length of a longer one, which is then dropped whole.
  char buffer[kMaxRecoveryNotice + 1];
  while (available()) {
    const ssize_t n = ::recv(fd_, buffer, sizeof(buffer), MSG_DONTWAIT | MSG_TRUNC);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) closed_ = true;  // the channel is broken
      break;
    }
    if (n == 0) {  // SOCK_SEQPACKET: end-of-file (the agent never sends an empty message)
      closed_ = true;
      break;
    }
    const std::size_t size = static_cast<std::size_t>(n);
    std::string why;
    std::optional<RecoveryNotice> notice;
    if (size > sizeof(buffer)) {
      why = "notice of " + std::to_string(size) + " bytes, over " + std::to_string(kMaxRecoveryNotice);
    } else {
      notice = parseRecoveryNotice(std::string_view(buffer, size), &why);
    }
    if (!notice) {
      drop(std::move(why));
      continue;
    }
    if (notice->round <= currentRound_) {
      drop("stale notice (round " + std::to_string(notice->round) + ", this process is in round " +
           std::to_string(currentRound_) + ")");
      continue;
    }
    // The newest wins: a later notice supersedes an earlier one of a lower or equal round. The
    // round is kept aside of the optional (GCC's -Wmaybe-uninitialized misreads the comparison).
    if (!latest || notice->round >= latestRound) {
      latestRound = notice->round;
      latest = std::move(notice);
    }
  }
  return latest;
}

std::optional<RecoveryNotice> NoticeReader::poll() { return drain(); }

std::optional<RecoveryNotice> NoticeReader::wait(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto latest = drain();
  while (!latest && available()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd_, POLLIN, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (rc < 0 && errno != EINTR) break;
    latest = drain();
  }
  return latest;
}

}  // namespace ddp
