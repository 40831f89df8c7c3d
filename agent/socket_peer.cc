#include "agent/socket_peer.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/unique_fd.h"

namespace ddprun {
namespace {

void say(std::string* why, std::string text) {
  if (why) *why = std::move(text);
}

std::string errnoText(const std::string& what, int err) { return what + ": " + std::strerror(err); }

// One end of a TCP connection as inet_diag_sockid spells it: IPv4 in addr[0], port in network
// byte order.
struct Endpoint {
  int family = AF_UNSPEC;
  uint32_t addr[4] = {0, 0, 0, 0};
  uint16_t port = 0;

  bool operator==(const Endpoint&) const = default;
};

// A v4-mapped IPv6 address (::ffff:a.b.c.d, a dual-stack socket talking IPv4) becomes plain IPv4:
// the kernel keys such connections by their IPv4 addresses.
Endpoint normalized(int family, const void* addr, uint16_t port) {
  Endpoint e;
  e.port = port;
  if (family == AF_INET) {
    e.family = AF_INET;
    std::memcpy(&e.addr[0], addr, 4);
    return e;
  }
  in6_addr a6;
  std::memcpy(&a6, addr, sizeof(a6));
  if (IN6_IS_ADDR_V4MAPPED(&a6)) {
    e.family = AF_INET;
    std::memcpy(&e.addr[0], &a6.s6_addr[12], 4);
  } else {
    e.family = AF_INET6;
    std::memcpy(e.addr, &a6, sizeof(a6));
  }
  return e;
}

std::optional<Endpoint> endpointOf(const sockaddr_storage& ss) {
  if (ss.ss_family == AF_INET) {
    const auto& sin = reinterpret_cast<const sockaddr_in&>(ss);
    return normalized(AF_INET, &sin.sin_addr, sin.sin_port);
  }
  if (ss.ss_family == AF_INET6) {
    const auto& sin6 = reinterpret_cast<const sockaddr_in6&>(ss);
    return normalized(AF_INET6, &sin6.sin6_addr, sin6.sin6_port);
  }
  return std::nullopt;
}

std::string text(const Endpoint& e) {
  char buf[INET6_ADDRSTRLEN] = "?";
  ::inet_ntop(e.family, e.addr, buf, sizeof(buf));
  const std::string port = std::to_string(ntohs(e.port));
  return e.family == AF_INET6 ? "[" + std::string(buf) + "]:" + port : std::string(buf) + ":" + port;
}

// The kernel's TCP state numbers (include/net/tcp_states.h), for messages.
std::string tcpStateName(unsigned state) {
  static const char* const kNames[] = {"?",          "ESTABLISHED", "SYN_SENT", "SYN_RECV", "FIN_WAIT1",
                                       "FIN_WAIT2",  "TIME_WAIT",   "CLOSE",    "CLOSE_WAIT", "LAST_ACK",
                                       "LISTEN",     "CLOSING",     "NEW_SYN_RECV"};
  return state < std::size(kNames) ? kNames[state] : "state " + std::to_string(state);
}

// The local and peer ends of `fd`, checked to be a connected TCP socket.
bool endsOf(int fd, Endpoint* local, Endpoint* peer, std::string* why) {
  int protocol = 0;
  socklen_t len = sizeof(protocol);
  if (::getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &protocol, &len) != 0) {
    say(why, errnoText("SO_PROTOCOL of fd " + std::to_string(fd), errno));
    return false;
  }
  if (protocol != IPPROTO_TCP) {
    say(why, "fd " + std::to_string(fd) + " is not a TCP socket");
    return false;
  }
  sockaddr_storage ss{};
  len = sizeof(ss);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    say(why, errnoText("getsockname", errno));
    return false;
  }
  auto l = endpointOf(ss);
  ss = {};
  len = sizeof(ss);
  // ENOTCONN here: the peer reset the connection before we looked.
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    say(why, errnoText("getpeername (the peer is gone)", errno));
    return false;
  }
  auto p = endpointOf(ss);
  if (!l || !p || l->family != p->family) {
    say(why, "fd " + std::to_string(fd) + " is not an IPv4 or IPv6 connection");
    return false;
  }
  *local = *l;
  *peer = *p;
  return true;
}

// The ends a sock_diag reply names, normalized like ours so that the two compare.
void replyEnds(const inet_diag_msg& m, Endpoint* src, Endpoint* dst) {
  *src = normalized(m.idiag_family, m.id.idiag_src, m.id.idiag_sport);
  *dst = normalized(m.idiag_family, m.id.idiag_dst, m.id.idiag_dport);
}

}  // namespace

std::optional<PeerSocket> peerSocketOf(int fd, std::string* why) {
  Endpoint local, peer;
  if (!endsOf(fd, &local, &peer, why)) return std::nullopt;

  UniqueFd nl(::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG));
  if (!nl) {
    say(why, errnoText("NETLINK_SOCK_DIAG socket", errno));
    return std::nullopt;
  }
  // The kernel answers at once; the timeout only guards against a reply that never comes.
  constexpr auto kTimeout = std::chrono::seconds(1);
  timeval tv{.tv_sec = 1, .tv_usec = 0};
  if (::setsockopt(nl.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0) {
    say(why, errnoText("SO_RCVTIMEO", errno));
    return std::nullopt;
  }

  static std::atomic<uint32_t> nextSeq{1};
  const uint32_t seq = nextSeq.fetch_add(1);
  struct {
    nlmsghdr header;
    inet_diag_req_v2 request;
  } message{};
  message.header.nlmsg_len = sizeof(message);
  message.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  message.header.nlmsg_flags = NLM_F_REQUEST;  // one exact socket, not a dump
  message.header.nlmsg_seq = seq;
  inet_diag_req_v2& req = message.request;
  req.sdiag_family = static_cast<uint8_t>(local.family);
  req.sdiag_protocol = IPPROTO_TCP;
  req.idiag_states = ~0u;  // whatever state it is in; a closed peer is told by its inode
  // The peer's socket sees the connection from its side: it is the source, we are the destination.
  std::memcpy(req.id.idiag_src, peer.addr, sizeof(peer.addr));
  req.id.idiag_sport = peer.port;
  std::memcpy(req.id.idiag_dst, local.addr, sizeof(local.addr));
  req.id.idiag_dport = local.port;
  req.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
  req.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;

  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  ssize_t sent;
  do {
    sent = ::sendto(nl.get(), &message, sizeof(message), 0, reinterpret_cast<sockaddr*>(&kernel), sizeof(kernel));
  } while (sent < 0 && errno == EINTR);
  if (sent != static_cast<ssize_t>(sizeof(message))) {
    say(why, errnoText("sock_diag request", sent < 0 ? errno : EIO));
    return std::nullopt;
  }

  const std::string tuple = "the socket at " + text(peer) + " connected to " + text(local);
  const auto deadline = std::chrono::steady_clock::now() + kTimeout;
  alignas(nlmsghdr) char buf[8192];
  while (std::chrono::steady_clock::now() < deadline) {
    sockaddr_nl from{};
    socklen_t fromLen = sizeof(from);
    ssize_t n = ::recvfrom(nl.get(), buf, sizeof(buf), 0, reinterpret_cast<sockaddr*>(&from), &fromLen);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      say(why, errnoText("sock_diag reply", errno));
      return std::nullopt;
    }
    if (from.nl_pid != 0) continue;  // only the kernel answers a sock_diag query
    // Walks the datagram's messages by hand: the NLMSG_OK macro compares signed with unsigned.
    size_t offset = 0;
    const size_t total = static_cast<size_t>(n);
    while (offset + sizeof(nlmsghdr) <= total) {
      const auto* h = reinterpret_cast<const nlmsghdr*>(buf + offset);
      if (h->nlmsg_len < sizeof(nlmsghdr) || h->nlmsg_len > total - offset) break;
      offset += NLMSG_ALIGN(h->nlmsg_len);
      if (h->nlmsg_seq != seq) continue;  // a stale answer to someone else's question
      if (h->nlmsg_type == NLMSG_ERROR) {
        if (h->nlmsg_len < NLMSG_LENGTH(sizeof(nlmsgerr))) {
          say(why, "sock_diag: truncated error reply");
          return std::nullopt;
        }
        const auto* err = static_cast<const nlmsgerr*>(NLMSG_DATA(h));
        if (err->error == 0) continue;  // an acknowledgement, not an answer
        if (err->error == -ENOENT) {
          say(why, "no TCP socket is " + tuple + " (the peer closed; or the kernel lacks tcp_diag)");
        } else {
          say(why, errnoText("sock_diag query for " + tuple, -err->error));
        }
        return std::nullopt;
      }
      if (h->nlmsg_type == NLMSG_DONE) {
        say(why, "sock_diag: no answer for " + tuple);
        return std::nullopt;
      }
      if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY) continue;
      if (h->nlmsg_len < NLMSG_LENGTH(sizeof(inet_diag_msg))) {
        say(why, "sock_diag: truncated reply");
        return std::nullopt;
      }
      const auto* m = static_cast<const inet_diag_msg*>(NLMSG_DATA(h));
      // The lookup falls back to listening sockets; only the exact connection will do.
      Endpoint src, dst;
      replyEnds(*m, &src, &dst);
      if (!(src == peer && dst == local)) {
        say(why, "sock_diag answered with another socket (" + text(src) + " -> " + text(dst) + ") than " + tuple);
        return std::nullopt;
      }
      // A socket its process closed lingers unowned (FIN_WAIT, TIME_WAIT) with inode 0.
      if (m->idiag_inode == 0) {
        say(why, tuple + " is held by no process (" + tcpStateName(m->idiag_state) + ": the peer closed)");
        return std::nullopt;
      }
      return PeerSocket{.inode = m->idiag_inode, .uid = static_cast<uid_t>(m->idiag_uid)};
    }
  }
  say(why, "sock_diag: no answer within 1 s for " + tuple);
  return std::nullopt;
}

bool processHoldsSocket(pid_t pid, uint64_t inode, std::string* why) {
  if (pid <= 0) {
    say(why, "no process " + std::to_string(pid));
    return false;
  }
  const std::string dirPath = "/proc/" + std::to_string(pid) + "/fd";
  DIR* dir = ::opendir(dirPath.c_str());
  if (!dir) {
    // EACCES: another user's (or a non-dumpable) process; ENOENT: it is gone.
    say(why, errnoText("cannot list " + dirPath, errno));
    return false;
  }
  const std::string wanted = "socket:[" + std::to_string(inode) + "]";
  char link[64];
  int scanned = 0;
  bool found = false;
  while (dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    if (++scanned > kMaxFdsScanned) {
      say(why, dirPath + " has more than " + std::to_string(kMaxFdsScanned) + " fds; not scanned further");
      break;
    }
    // An fd closed since readdir fails here; it is not ours to find then.
    ssize_t n = ::readlinkat(::dirfd(dir), entry->d_name, link, sizeof(link));
    if (n == static_cast<ssize_t>(wanted.size()) && std::memcmp(link, wanted.data(), wanted.size()) == 0) {
      found = true;
      break;
    }
  }
  ::closedir(dir);
  return found;
}

std::optional<pid_t> ProcSocketPeerFinder::ownerAmong(int fd, const std::vector<pid_t>& candidates, std::string* why) {
  auto peer = peerSocketOf(fd, why);
  if (!peer) return std::nullopt;
  if (candidates.empty()) {
    say(why, "no candidate processes to hold socket inode " + std::to_string(peer->inode));
    return std::nullopt;
  }
  // Candidates whose fds could not be read: for them "does not hold it" is not certain.
  std::string untold;
  size_t untoldCount = 0;
  for (pid_t pid : candidates) {
    std::string reason;
    if (processHoldsSocket(pid, peer->inode, &reason)) return pid;
    if (reason.empty()) continue;
    if (++untoldCount <= 3) untold += "; " + reason;
  }
  if (untoldCount > 3) untold += "; and " + std::to_string(untoldCount - 3) + " more that could not be read";
  say(why, "none of the " + std::to_string(candidates.size()) + " candidate processes holds the peer socket (inode " +
               std::to_string(peer->inode) + ", uid " + std::to_string(peer->uid) + ")" + untold);
  return std::nullopt;
}

}  // namespace ddprun
