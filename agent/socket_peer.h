// Who is on the other end of a loopback TCP connection this process accepted. The agent serves
// torch's TCPStore protocol on 127.0.0.1 to its node's workers; that protocol carries no
// credential, so the agent admits a connection only when the process holding the peer socket is
// one of the job's. The kernel tells which socket that is (sock_diag) and /proc who holds it.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddprun {

// Who holds the other end of a TCP connection this process accepted on a loopback address.
class SocketPeerFinder {
 public:
  virtual ~SocketPeerFinder() = default;
  // The process among `candidates` that holds the peer socket of the accepted TCP socket `fd` (the
  // first of them in their order, should several share it); nullopt when none does, or when it
  // cannot be told: `why` (may be null) says which.
  virtual std::optional<pid_t> ownerAmong(int fd, const std::vector<pid_t>& candidates, std::string* why) = 0;
};

// The real one: sock_diag + /proc. Needs no privilege for peers of the agent's own user; the fds
// of another user's process cannot be read without CAP_SYS_PTRACE (then nullopt, with why).
class ProcSocketPeerFinder final : public SocketPeerFinder {
 public:
  std::optional<pid_t> ownerAmong(int fd, const std::vector<pid_t>& candidates, std::string* why) override;
};

// The socket at the other end of a connection, as the kernel knows it.
struct PeerSocket {
  uint64_t inode = 0;
  uid_t uid = 0;
};

// The inode (and uid) of the socket at the other end of the accepted TCP socket `fd`, found with a
// NETLINK_SOCK_DIAG query for the exact 4-tuple (src = our peer address, dst = our local address),
// IPv4 and IPv6 (v4-mapped peers queried as IPv4), in this process's network namespace. nullopt
// with `why` when the peer socket is gone or no longer held by any process (the peer closed), or
// the kernel cannot be asked; never blocks past about a second.
std::optional<PeerSocket> peerSocketOf(int fd, std::string* why);

// Whether process `pid` has a file descriptor on socket inode `inode` (/proc/<pid>/fd/* reads
// "socket:[<inode>]"). False also when it cannot be told (the process is gone, its fds are not
// readable, or it has more than kMaxFdsScanned): then `why` (may be null) says so.
bool processHoldsSocket(pid_t pid, uint64_t inode, std::string* why = nullptr);

// processHoldsSocket's bound: a process with more fds is not scanned further.
inline constexpr int kMaxFdsScanned = 65536;

}  // namespace ddprun
