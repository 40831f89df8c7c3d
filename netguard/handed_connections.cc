#include "netguard/handed_connections.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>

namespace ddprun {

namespace {

int descriptorLimit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return 1 << 20;
  return static_cast<int>(std::min<rlim_t>(limit.rlim_cur, 1 << 24));
}

}  // namespace

int HandedConnections::fdOfPeer(const std::string& grpcPeer) {
  if (grpcPeer.rfind("fd:", 0) != 0) return -1;
  return std::atoi(grpcPeer.c_str() + 3);
}

UniqueFd HandedConnections::renumbered(UniqueFd fd) {
  const int limit = descriptorLimit();
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (cursor_ < firstNumber_ || cursor_ >= limit) cursor_ = firstNumber_;
    const int moved = ::fcntl(fd.get(), F_DUPFD_CLOEXEC, cursor_);
    if (moved >= 0) {
      cursor_ = moved + 1;
      return UniqueFd(moved);
    }
    cursor_ = firstNumber_;  // nothing free above the cursor: wrap around once
  }
  return fd;
}

UniqueFd HandedConnections::add(UniqueFd fd, std::string address, uint64_t relayId, bool probation,
                                Clock::time_point now) {
  fd = renumbered(std::move(fd));
  struct stat st{};
  ::fstat(fd.get(), &st);
  std::lock_guard<std::mutex> lock(mu_);
  entries_.insert_or_assign(fd.get(), Entry{std::move(address), st.st_ino, CallBudget(now, limits_), relayId, false,
                                            probation});
  return fd;
}

std::string HandedConnections::address(const std::string& grpcPeer) const {
  const int fd = fdOfPeer(grpcPeer);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(fd);
  return it == entries_.end() ? std::string() : it->second.address;
}

HandedConnections::Verdict HandedConnections::admit(const std::string& grpcPeer, bool authenticated,
                                                    Clock::time_point now) {
  Verdict v;
  const int fd = fdOfPeer(grpcPeer);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(fd);
  if (it == entries_.end()) return v;
  Entry& e = it->second;
  const bool refusedBefore = e.budget.refused();
  v.admitted = e.budget.admit(now, authenticated, limits_);
  v.relayId = e.relayId;
  if (v.admitted) {
    if (authenticated && !e.trusted && !e.probation && e.relayId != 0) {
      e.trusted = true;  // its first call with the token: the relay lets it open more streams
      v.then = Verdict::Then::kTrust;
    }
  } else if (!refusedBefore) {
    if (e.relayId == 0) {
      // Under the lock that add() takes: the number cannot have passed to a newer connection of
      // ours meanwhile, and the inode tells whether it still is this socket.
      struct stat st{};
      if (::fstat(fd, &st) == 0 && st.st_ino == e.inode) ::shutdown(fd, SHUT_RDWR);
    }
    v.address = e.address;
    v.why = e.budget.why();
    v.then = Verdict::Then::kCut;
  }
  return v;
}

std::size_t HandedConnections::open() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = entries_.begin(); it != entries_.end();) {
    struct stat st{};
    const bool same = ::fstat(it->first, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_ino == it->second.inode;
    it = same ? std::next(it) : entries_.erase(it);
  }
  return entries_.size();
}

}  // namespace ddprun
