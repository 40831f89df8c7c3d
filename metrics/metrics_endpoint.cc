// MetricsEndpoint on Boost.Beast: one io_context on one thread. Each connection reads one request
// under a deadline, gets one answer written whole, and is closed (no keep-alive), so a connection
// that sends nothing costs a socket and a timer and never holds up anyone else. Stopping is
// io_context::stop() and a join: no polling loop to wait out.
//
// The bounds on open connections never shut out a probe (issue #37 item 4: 64 silent connections
// reopened as they closed left /healthz answering 2 probes of 80): at a bound, the newcomer takes
// the place of the oldest connection still waiting for its request, and a connection whose request
// has arrived is never evicted, so a probe is answered ahead of every silent connection.
#include "metrics/metrics_endpoint.h"

#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <list>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>

#include "common/error.h"
#include "common/net.h"

namespace ddprun {

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

// The largest request line plus headers read: scrapers and probes send a few short ones.
constexpr std::uint32_t kMaxHeaderBytes = 4096;
constexpr const char* kMetricsContentType = "text/plain; version=0.0.4; charset=utf-8";
// Connections taken from the backlog before other handlers get a turn (a connect flood).
constexpr int kAcceptBatch = 64;
// accept() failing for want of resources (file descriptors): the pending connections stay queued,
// and accepting resumes after this instead of spinning.
constexpr std::chrono::milliseconds kAcceptRetry{100};

struct Reply {  // the default: a collectable or the readiness check threw
  http::status status = http::status::internal_server_error;
  std::string body = "internal error\n";
  const char* contentType = "text/plain; charset=utf-8";
  bool allow = false;  // 405: name the methods that are
};

// The whole answer, Content-Length included; a HEAD answer has the GET answer's headers only.
http::message_generator toMessage(Reply reply, bool head) {
  http::response_header<> header;
  header.version(11);
  header.result(reply.status);
  header.set(http::field::content_type, reply.contentType);
  header.set(http::field::content_length, std::to_string(reply.body.size()));
  header.set(http::field::cache_control, "no-store");
  header.set(http::field::connection, "close");
  if (reply.allow) header.set(http::field::allow, "GET, HEAD");
  if (head) return http::response<http::empty_body>(std::move(header));
  return http::response<http::string_body>(std::move(header), std::move(reply.body));
}

// The client's address as a key: the IP's bytes, an IPv4-mapped IPv6 address as its IPv4 one (a
// dual-stack listener sees IPv4 clients that way).
std::string clientKey(const sockaddr_storage& from) {
  if (from.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(from);
    return {reinterpret_cast<const char*>(&v4.sin_addr), sizeof(v4.sin_addr)};
  }
  if (from.ss_family == AF_INET6) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(from);
    const auto* bytes = reinterpret_cast<const char*>(&v6.sin6_addr);
    if (IN6_IS_ADDR_V4MAPPED(&v6.sin6_addr)) return {bytes + 12, 4};
    return {bytes, sizeof(v6.sin6_addr)};
  }
  return {};
}

bool transientAcceptError(int err) {
  // accept(2): Linux reports the new connection's pending network errors from accept(); the
  // listening socket is fine, take the next one.
  switch (err) {
    case EINTR: case ECONNABORTED: case EPROTO: case EPERM: case ENETDOWN: case ENOPROTOOPT:
    case EHOSTDOWN: case ENONET: case EHOSTUNREACH: case EOPNOTSUPP: case ENETUNREACH:
      return true;
    default:
      return false;
  }
}

}  // namespace

class MetricsEndpoint::Server {
 public:
  // Binds and listens on the first of `host`'s addresses that can be bound, and starts the thread.
  // Throws boost::system::system_error when none can.
  Server(const MetricsEndpoint& endpoint, const std::string& host, int port) : endpoint_(endpoint) {
    boost::system::error_code ec;
    std::vector<tcp::endpoint> candidates;
    if (const auto ip = asio::ip::make_address(host, ec); !ec) {
      candidates.emplace_back(ip, static_cast<unsigned short>(port));
    } else {
      for (const auto& entry : tcp::resolver(io_).resolve(host, std::to_string(port))) candidates.push_back(entry);
    }
    for (const auto& where : candidates) {
      acceptor_.close(ec);
      if (!(ec = listen(where))) break;
    }
    if (ec) throw boost::system::system_error(ec);
    protocol_ = acceptor_.local_endpoint().protocol();
    port_ = acceptor_.local_endpoint().port();
    waitForConnection();
    thread_ = std::thread([this] { run(); });
  }
  // The thread stops between two handlers: a running scrape finishes, nothing else is waited for.
  // The io_context's destructor then closes every connection its pending handlers hold.
  ~Server() {
    io_.stop();
    thread_.join();
  }
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int port() const { return port_; }

 private:
  class Connection;

  // A listening socket that is not inherited by the processes the agent starts: Asio's own
  // open() and accept() leave FD_CLOEXEC off.
  boost::system::error_code listen(const tcp::endpoint& where) {
    boost::system::error_code ec;
    const int fd = ::socket(where.protocol().family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return {errno, boost::system::system_category()};
    if (acceptor_.assign(where.protocol(), fd, ec)) {
      ::close(fd);
      return ec;
    }
    acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor_.bind(where, ec);
    if (!ec) acceptor_.listen(tcp::acceptor::max_listen_connections, ec);
    return ec;
  }

  void run() {
    for (;;) {
      try {
        io_.run();
        return;
      } catch (const std::exception& e) {  // a handler failed (memory): keep serving the others
        spdlog::warn("metrics endpoint: {}", e.what());
      }
    }
  }

  void waitForConnection() {
    acceptor_.async_wait(tcp::acceptor::wait_read, [this](boost::system::error_code ec) {
      if (!ec) acceptPending();
    });
  }

  // Takes connections until the backlog is empty: Asio's epoll is edge-triggered, so a wait
  // started while connections are still queued would not complete before the next one came.
  void acceptPending();
  // Whether a connection from `client` may be served, making room by evicting the oldest waiting
  // connection (of `client` when it is at its own bound) where a bound is reached.
  bool makeRoom(const std::string& client);
  Connection* oldestWaiting(const std::string* client) const;

  Reply answer(std::string_view method, std::string_view path) const {
    if (path != "/metrics" && path != "/healthz" && path != "/readyz") return {http::status::not_found, "not found\n"};
    if (method != "GET" && method != "HEAD")
      return {http::status::method_not_allowed, "method not allowed\n", "text/plain; charset=utf-8", true};
    if (path == "/metrics") return {http::status::ok, endpoint_.scrape(), kMetricsContentType};
    if (path == "/healthz") return {http::status::ok, "ok\n"};
    if (endpoint_.ready()) return {http::status::ok, "ready\n"};
    return {http::status::service_unavailable, "not ready\n"};
  }

  const MetricsEndpoint& endpoint_;
  // Open connections, per client address, and those still waiting for their request (oldest
  // first: the ones to evict); touched by the thread, and by ~io_context (after the join) as the
  // connections go: declared before io_ so that they outlive them.
  int open_ = 0;
  std::unordered_map<std::string, int> perClient_;
  std::list<Connection*> waiting_;
  bool acceptFailing_ = false;
  asio::io_context io_{1};  // the hint: one thread runs it
  tcp::acceptor acceptor_{io_};
  asio::steady_timer retry_{io_};
  tcp protocol_ = tcp::v4();
  int port_ = 0;
  std::thread thread_;
};

// One request and its answer. Owned by its pending handlers: it goes, and its socket closes,
// when the last one has run.
class MetricsEndpoint::Server::Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(Server& server, tcp::socket socket, std::string client)
      : server_(server), stream_(std::move(socket)), client_(std::move(client)) {
    ++server_.open_;
    ++server_.perClient_[client_];
    waitingAt_ = server_.waiting_.insert(server_.waiting_.end(), this);
    parser_.header_limit(kMaxHeaderBytes);
    parser_.body_limit(0);  // GET and HEAD have no body
  }
  ~Connection() { release(); }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  const std::string& client() const { return client_; }
  // Bytes have arrived that its read has not taken yet: likely its request, about to be answered.
  bool hasUnread() {
    int pending = 0;
    return ::ioctl(stream_.socket().native_handle(), FIONREAD, &pending) == 0 && pending > 0;
  }

  // Gives its place to a newcomer: it no longer counts against the bounds, and its socket closes,
  // which ends its pending read (this object goes once that handler has run).
  void evict() {
    release();
    boost::system::error_code ignored;
    stream_.socket().close(ignored);
    deadline_.cancel();
  }

  void start() {
    deadline_.expires_after(server_.endpoint_.options_.requestTimeout);
    deadline_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      boost::system::error_code ignored;
      if (!ec) self->stream_.socket().close(ignored);  // no whole request in time: ends the wait
    });
    waitForBytes();
  }

 private:
  // Out of the bounds' counts, once (evicted, or gone).
  void release() {
    if (!counted_) return;
    counted_ = false;
    settle();
    --server_.open_;
    if (const auto it = server_.perClient_.find(client_); it != server_.perClient_.end() && --it->second <= 0)
      server_.perClient_.erase(it);
  }
  // No longer waiting: its request is in (never evicted from here on), or it is going.
  void settle() {
    if (!waiting_) return;
    waiting_ = false;
    server_.waiting_.erase(waitingAt_);
  }

  // The request is read here, not by http::async_read: that one's reads take the bytes out of the
  // socket in the reactor, before its handler runs, so an eviction in between would see neither
  // unread bytes nor a parsed request and could evict a probe whose request is in. Waiting for
  // readability leaves them in the socket (hasUnread) until this handler reads and parses them.
  void waitForBytes() {
    stream_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this()](boost::system::error_code ec) {
      if (!ec) self->onReadable();  // else closed: by the deadline, an eviction or the server's stop
    });
  }

  void onReadable() {
    for (;;) {
      beast::error_code ec;
      const std::size_t room = buffer_.max_size() - buffer_.size();
      if (room == 0) return onRequest(http::error::header_limit);
      const std::size_t n = stream_.socket().read_some(buffer_.prepare(std::min<std::size_t>(room, 4096)), ec);
      if (ec == asio::error::would_block || ec == asio::error::try_again) return waitForBytes();
      if (ec == asio::error::eof) {
        parser_.put_eof(ec);
        return onRequest(parser_.got_some() ? (ec ? ec : beast::error_code(http::error::partial_message))
                                            : beast::error_code(http::error::end_of_stream));
      }
      if (ec) return onRequest(ec);
      buffer_.commit(n);
      // As http::read does: the parser takes what it can; need_more asks for the next bytes.
      while (buffer_.size() > 0 && !parser_.is_done()) {
        const std::size_t used = parser_.put(buffer_.data(), ec);
        buffer_.consume(used);
        if (ec == http::error::need_more) break;
        if (ec) return onRequest(ec);
        if (used == 0) break;
      }
      if (parser_.is_done()) return onRequest({});
    }
  }

  void onRequest(beast::error_code ec) {
    settle();
    deadline_.cancel();
    // Timed out, went away or sent half a request: nobody to answer.
    if (ec == http::error::end_of_stream || ec == http::error::partial_message) return;
    if (ec && ec.category() != http::make_error_code(http::error::bad_method).category()) return;
    Reply reply;
    bool head = false;
    // A request with a body is answered from its headers, which body_limit comes after (405 or
    // 404: only GET and HEAD succeed).
    if (ec && ec != http::error::body_limit) {  // not HTTP, or too large
      reply = {http::status::bad_request, "bad request\n"};
    } else {
      const auto& request = parser_.get();
      const std::string_view method = request.method_string();
      std::string_view path = request.target();
      path = path.substr(0, path.find('?'));
      head = method == "HEAD";
      try {
        reply = server_.answer(method, path);
      } catch (const std::exception& e) {
        spdlog::warn("metrics endpoint: cannot answer {} {}: {}", method, path, e.what());
      } catch (...) {
        spdlog::warn("metrics endpoint: cannot answer {} {}: unknown exception", method, path);
      }
    }
    stream_.expires_after(server_.endpoint_.options_.requestTimeout);
    beast::async_write(stream_, toMessage(std::move(reply), head),
                       [self = shared_from_this()](beast::error_code, std::size_t) {
                         // A client that went away is no error of ours. The FIN follows the
                         // answer; the socket closes as this object goes.
                         boost::system::error_code ignored;
                         self->stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
                       });
  }

  Server& server_;
  beast::tcp_stream stream_;
  const std::string client_;
  std::list<Connection*>::iterator waitingAt_;
  bool waiting_ = true;
  bool counted_ = true;
  beast::flat_buffer buffer_{2 * kMaxHeaderBytes};
  asio::steady_timer deadline_{stream_.get_executor()};  // for the request; the answer's is stream_'s
  http::request_parser<http::empty_body> parser_;
};

void MetricsEndpoint::Server::acceptPending() {
  for (int i = 0; i < kAcceptBatch; ++i) {
    sockaddr_storage from{};
    socklen_t fromLength = sizeof(from);
    const int fd = ::accept4(acceptor_.native_handle(), reinterpret_cast<sockaddr*>(&from), &fromLength,
                             SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return waitForConnection();
    if (fd < 0 && transientAcceptError(errno)) continue;
    if (fd < 0) {
      if (!acceptFailing_) spdlog::warn("metrics endpoint: cannot accept connections: {}", std::strerror(errno));
      acceptFailing_ = true;
      retry_.expires_after(kAcceptRetry);
      retry_.async_wait([this](boost::system::error_code ec) {
        if (!ec) acceptPending();
      });
      return;
    }
    acceptFailing_ = false;
    std::string client = clientKey(from);
    if (!makeRoom(client)) {
      ::close(fd);  // every place is taken by a connection being answered: closed at once
      continue;
    }
    tcp::socket socket(io_);
    boost::system::error_code ec;
    if (socket.assign(protocol_, fd, ec) || socket.non_blocking(true, ec)) {  // read_some must not block
      if (socket.is_open()) socket.close(ec);
      else ::close(fd);
      continue;
    }
    std::make_shared<Connection>(*this, std::move(socket), std::move(client))->start();
  }
  asio::post(io_, [this] { acceptPending(); });
}

bool MetricsEndpoint::Server::makeRoom(const std::string& client) {
  const auto& options = endpoint_.options_;
  const int perClientBound = options.maxConnectionsPerAddress > 0 ? options.maxConnectionsPerAddress
                                                                  : std::max(1, options.maxConnections / 2);
  const auto it = perClient_.find(client);
  if (it != perClient_.end() && it->second >= perClientBound) {
    // The address's own oldest: one address never evicts another's connections.
    Connection* victim = oldestWaiting(&client);
    if (!victim) return false;
    victim->evict();
  }
  if (open_ >= options.maxConnections) {
    Connection* victim = oldestWaiting(nullptr);
    if (!victim) return false;
    victim->evict();
  }
  return true;
}

MetricsEndpoint::Server::Connection* MetricsEndpoint::Server::oldestWaiting(const std::string* client) const {
  // One whose request bytes are in but not yet parsed (a probe accepted in the same batch as a
  // flood) is passed over: it is not idle.
  for (Connection* connection : waiting_)
    if ((!client || connection->client() == *client) && !connection->hasUnread()) return connection;
  return nullptr;
}

MetricsEndpoint::MetricsEndpoint(Options options, std::vector<std::weak_ptr<prometheus::Collectable>> collectables,
                                 Readiness readiness)
    : options_(std::move(options)), collectables_(std::move(collectables)), readiness_(std::move(readiness)) {
  const std::string& host = options_.bindAddress;
  const auto fail = [&](std::string why) {
    if (!why.empty()) why[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(why[0])));
    return ConfigError("cannot serve metrics on " + joinHostPort(host, options_.port) + ": " + why);
  };
  if (host.empty()) throw fail("empty bind address");
  if (options_.port < 0 || options_.port > 65535) throw fail("port out of range");
  if (options_.maxConnections < 1 || options_.maxConnectionsPerAddress < 0 || options_.requestTimeout.count() < 1)
    throw fail("the connection bounds and the request timeout must be positive");
  try {
    server_ = std::make_unique<Server>(*this, host, options_.port);
  } catch (const boost::system::system_error& e) {
    throw fail(e.code().message());  // "address already in use", "host not found (authoritative)"
  }
  port_ = server_->port();
}

MetricsEndpoint::~MetricsEndpoint() = default;

std::string MetricsEndpoint::address() const { return joinHostPort(options_.bindAddress, port_); }

std::string MetricsEndpoint::scrape() const {
  std::vector<prometheus::MetricFamily> families;
  for (const auto& weak : collectables_) {
    const auto collectable = weak.lock();
    if (!collectable) continue;
    auto collected = collectable->Collect();
    families.insert(families.end(), std::make_move_iterator(collected.begin()),
                    std::make_move_iterator(collected.end()));
  }
  return prometheus::TextSerializer().Serialize(families);
}

bool MetricsEndpoint::ready() const {
  if (!readiness_) return true;
  try {
    return readiness_();
  } catch (const std::exception& e) {
    spdlog::debug("metrics endpoint: readiness check threw, answering not ready: {}", e.what());
    return false;
  } catch (...) {
    spdlog::debug("metrics endpoint: readiness check threw, answering not ready");
    return false;
  }
}

}  // namespace ddprun
