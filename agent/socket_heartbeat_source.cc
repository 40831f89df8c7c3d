#include "agent/socket_heartbeat_source.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <cerrno>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "common/error.h"
#include "common/unique_fd.h"

namespace ddprun {

class SocketHeartbeatSource::Impl : public std::enable_shared_from_this<SocketHeartbeatSource::Impl> {
 public:
  explicit Impl(boost::asio::io_context& io) : io_(io), named_(std::make_shared<Channel>(io)) {
    UniqueFd sock(::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!sock) throw DDPRUN_SYSTEM_ERROR("heartbeat socket");
    std::random_device rd;
    std::string abstract = "ddprun-hb-" + std::to_string(::getpid()) + "-" + std::to_string(rd());
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path + 1, abstract.data(), abstract.size());  // sun_path[0] = 0: abstract
    auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + abstract.size());
    if (::bind(sock.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) throw DDPRUN_SYSTEM_ERROR("bind " + abstract);
    name_ = "@" + abstract;
    named_->end.assign(sock.release());
  }

  void start() { waitReadable(named_); }

  void stop() {
    boost::system::error_code ignored;
    named_->end.close(ignored);
    closeChannels();
  }

  const std::string& name() const { return name_; }
  void setOnBeat(OnBeat onBeat) { onBeat_ = std::move(onBeat); }

  void newAttempt(const std::vector<int>& keep) {
    std::map<int, std::shared_ptr<Channel>> kept;
    for (int key : keep) {
      if (auto it = channels_.find(key); it != channels_.end()) kept.emplace(key, it->second), channels_.erase(it);
    }
    closeChannels();
    channels_ = std::move(kept);
    // Whatever the named socket queued was sent by the previous attempt.
    readAll(*named_, /*deliver=*/false);
  }

  WorkerChannelEnd openChannel(int localRank) {
    // CLOEXEC on both ends: the worker's end is made inheritable in its own child only
    // (worker_spawn.cc), so that no other worker and no helper the agent runs holds it.
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) throw DDPRUN_SYSTEM_ERROR("heartbeat socketpair");
    UniqueFd agentEnd(fds[0]);
    UniqueFd workerEnd(fds[1]);
    // Non-blocking on the agent's side only: the flag belongs to the open file, which the worker's
    // end does not share.
    if (::fcntl(agentEnd.get(), F_SETFL, ::fcntl(agentEnd.get(), F_GETFL) | O_NONBLOCK) != 0) {
      throw DDPRUN_SYSTEM_ERROR("heartbeat socketpair");
    }
    auto channel = std::make_shared<Channel>(io_);
    channel->end.assign(agentEnd.release());
    WorkerChannelEnd end;
    end.fd = workerEnd.get();
    end.env = {{"DDPRUN_HEARTBEAT_FD", std::to_string(end.fd)}, {"DDPRUN_HEARTBEAT_SOCKET", name_}};
    channel->workerEnd = std::move(workerEnd);
    waitReadable(channel);
    if (auto old = channels_.find(localRank); old != channels_.end()) {
      boost::system::error_code ignored;
      old->second->end.close(ignored);
    }
    channels_[localRank] = std::move(channel);
    return end;
  }

  void workersSpawned() {
    for (auto& [localRank, channel] : channels_) channel->workerEnd.reset();
  }

  void workerSpawned(int localRank) {
    if (auto it = channels_.find(localRank); it != channels_.end()) it->second->workerEnd.reset();
  }

  void moveChannel(int from, int to) {
    auto it = channels_.find(from);
    if (it == channels_.end()) return;
    auto channel = it->second;
    channels_.erase(it);
    if (auto old = channels_.find(to); old != channels_.end()) {
      boost::system::error_code ignored;
      old->second->end.close(ignored);
    }
    channels_[to] = std::move(channel);
  }

  bool sendToWorker(int localRank, const std::string& message) {
    auto it = channels_.find(localRank);
    if (it == channels_.end() || !it->second->end.is_open()) return false;
    // Never blocks: a worker that reads nothing for long has a full queue and misses the notice;
    // it then fails on its peers' closed connections, which the recovery bound covers.
    const ssize_t n = ::send(it->second->end.native_handle(), message.data(), message.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    return n == static_cast<ssize_t>(message.size());
  }

  void drain() {
    readAll(*named_, true);
    std::vector<std::shared_ptr<Channel>> channels;  // a beat's handler may start a new attempt
    for (const auto& [localRank, channel] : channels_) channels.push_back(channel);
    for (const auto& channel : channels) readAll(*channel, true);
  }

 private:
  struct Channel {
    explicit Channel(boost::asio::io_context& io) : end(io) {}
    boost::asio::posix::stream_descriptor end;  // the agent's end (or the named socket)
    UniqueFd workerEnd;                         // until the worker is spawned
  };

  void waitReadable(const std::shared_ptr<Channel>& channel) {
    channel->end.async_wait(boost::asio::posix::descriptor_base::wait_read,
                            [self = shared_from_this(), channel](const boost::system::error_code& ec) {
                              if (ec) return;  // closed: a new attempt, or the source is gone
                              if (self->readAll(*channel, true)) self->waitReadable(channel);
                            });
  }

  // Reads every queued message; false once the channel is closed (its worker's end closed).
  bool readAll(Channel& channel, bool deliver) {
    if (!channel.end.is_open()) return false;
    char buf[kMaxHeartbeatDatagram + 2];
    while (true) {
      // MSG_TRUNC: the real length, so that an oversized message is rejected, not cut and read.
      const ssize_t n = ::recv(channel.end.native_handle(), buf, sizeof(buf), MSG_DONTWAIT | MSG_TRUNC);
      const bool named = &channel == named_.get();
      if (n < 0 && (errno == EAGAIN || errno == EINTR || named)) return true;
      if (n <= 0 && !named) {  // every copy of the worker's end is closed: its processes are gone
        boost::system::error_code ignored;
        channel.end.close(ignored);
        return false;
      }
      if (!deliver || n <= 0 || static_cast<std::size_t>(n) > kMaxHeartbeatDatagram) continue;
      auto message = parseHeartbeat(std::string_view(buf, static_cast<std::size_t>(n)));
      if (message && onBeat_) onBeat_(*message);
    }
  }

  void closeChannels() {
    boost::system::error_code ignored;
    for (auto& [localRank, channel] : channels_) channel->end.close(ignored);
    channels_.clear();
  }

  boost::asio::io_context& io_;
  std::shared_ptr<Channel> named_;  // DDPRUN_HEARTBEAT_SOCKET
  std::string name_;
  OnBeat onBeat_;
  std::map<int, std::shared_ptr<Channel>> channels_;  // this attempt's, by local rank
};

SocketHeartbeatSource::SocketHeartbeatSource(boost::asio::io_context& io) : impl_(std::make_shared<Impl>(io)) {
  impl_->start();
}
SocketHeartbeatSource::~SocketHeartbeatSource() { impl_->stop(); }
const std::string& SocketHeartbeatSource::socketName() const { return impl_->name(); }
void SocketHeartbeatSource::setOnBeat(OnBeat onBeat) { impl_->setOnBeat(std::move(onBeat)); }
void SocketHeartbeatSource::newAttempt(const std::vector<int>& keep) { impl_->newAttempt(keep); }
WorkerChannelEnd SocketHeartbeatSource::openChannel(int localRank) { return impl_->openChannel(localRank); }
void SocketHeartbeatSource::workersSpawned() { impl_->workersSpawned(); }
WorkerChannelEnd SocketHeartbeatSource::reopenChannel(int localRank) { return impl_->openChannel(localRank); }
void SocketHeartbeatSource::workerSpawned(int localRank) { impl_->workerSpawned(localRank); }
void SocketHeartbeatSource::moveChannel(int from, int to) { impl_->moveChannel(from, to); }
bool SocketHeartbeatSource::sendToWorker(int localRank, const std::string& message) {
  return impl_->sendToWorker(localRank, message);
}
void SocketHeartbeatSource::drain() { impl_->drain(); }

}  // namespace ddprun
