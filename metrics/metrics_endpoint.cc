// MetricsEndpoint on civetweb: one request handler for every path and method, answers written
// whole with their Content-Length, and civetweb's log lines sent to spdlog instead of stdout.
#include "metrics/metrics_endpoint.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CivetServer.h>
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cctype>
#include <optional>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>

#include "common/error.h"
#include "common/net.h"

namespace ddprun {

namespace {

constexpr unsigned kCivetFeatureIpv6 = 8;  // mg_check_feature()'s bit for IPv6 (civetweb.h)
// The largest request line plus headers civetweb reads: scrapers and probes send a few short ones.
constexpr int kMaxRequestBytes = 4096;
constexpr const char* kMetricsContentType = "text/plain; version=0.0.4; charset=utf-8";

struct Reply {  // the default: a collectable or the readiness check threw
  int status = 500;
  const char* reason = "Internal Server Error";
  std::string body = "internal error\n";
  const char* contentType = "text/plain; charset=utf-8";
  const char* extraHeaders = "";
};

void respond(mg_connection* conn, bool head, const Reply& reply) {
  const std::string header = "HTTP/1.1 " + std::to_string(reply.status) + " " + reply.reason +
                             "\r\nContent-Type: " + reply.contentType +
                             "\r\nContent-Length: " + std::to_string(reply.body.size()) +
                             "\r\nCache-Control: no-store\r\nConnection: close\r\n" + reply.extraHeaders + "\r\n";
  // A client that went away is no error of ours: write results are not checked.
  mg_write(conn, header.data(), header.size());
  if (!head) mg_write(conn, reply.body.data(), reply.body.size());
}

// civetweb's start failures read "cannot bind to 127.0.0.1:9999: 98 (Address already in use)":
// the text in the last parentheses is the reason; other messages are the reason as they are.
std::string startFailureReason(std::string message) {
  if (message.empty()) return "civetweb could not start";
  if (message.find("invalid port spec") != std::string::npos)
    return "not an IPv4 address or a host name that resolves";
  const auto open = message.rfind('(');
  if (message.back() == ')' && open != std::string::npos) message = message.substr(open + 1, message.size() - open - 2);
  if (!message.empty()) message[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(message[0])));
  return message;
}

// The address that reaches the listening socket (loopback for a wildcard bind), IPv4 only as
// civetweb binds.
std::optional<sockaddr_in> reachableAddress(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host == "0.0.0.0" ? "127.0.0.1" : host.c_str(), nullptr, &hints, &found) != 0 || !found)
    return std::nullopt;
  sockaddr_in address = *reinterpret_cast<const sockaddr_in*>(found->ai_addr);
  ::freeaddrinfo(found);
  address.sin_port = htons(static_cast<uint16_t>(port));
  return address;
}

// One connection, closed at once: readiness for the accept loop's poll.
void poke(const sockaddr_in& address) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  const timeval limit{0, 100'000};  // connect() honours the send timeout
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit));
  ::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address));
  ::close(fd);
}

}  // namespace

class MetricsEndpoint::Server final : public CivetServer {
 public:
  Server(const std::vector<std::string>& options, const CivetCallbacks& callbacks, MetricsEndpoint& endpoint)
      : CivetServer(options, &callbacks, &endpoint) {
    // The C API, not addHandler(): a CivetHandler sees only the seven methods it names, and every
    // method but GET and HEAD must get 405. "/" matches every path.
    mg_set_request_handler(context, "/", &Server::handle, &endpoint);
  }
  // Stops the threads while this object is whole: they call into the endpoint until then.
  // civetweb's accept loop polls in 2 s slices and reads its stop flag in between; connections to
  // the listening socket while close() runs wake it at once, which cuts a stop from up to 2 s to
  // milliseconds (an agent's exit waits for it).
  ~Server() override {
    std::atomic<bool> closed{false};
    std::optional<std::thread> waker;
    try {
      if (wake_) waker.emplace([&] {
        while (!closed) {
          poke(*wake_);
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
      });
    } catch (const std::system_error&) {  // no thread: the stop just takes longer
    }
    close();
    closed = true;
    if (waker) waker->join();
  }

  // Where close() connects to wake the accept loop; none: the stop takes up to 2 s.
  void setWakeAddress(std::optional<sockaddr_in> address) { wake_ = address; }

  static int handle(mg_connection* conn, void* cbdata) {
    const auto& self = *static_cast<const MetricsEndpoint*>(cbdata);
    const mg_request_info* request = mg_get_request_info(conn);
    const std::string_view method = request->request_method;
    const std::string_view path = request->local_uri ? request->local_uri : "";
    Reply reply;
    try {  // nothing may unwind through civetweb's C frames
      reply = answer(self, method, path);
    } catch (const std::exception& e) {
      spdlog::warn("metrics endpoint: cannot answer {} {}: {}", method, path, e.what());
    } catch (...) {
      spdlog::warn("metrics endpoint: cannot answer {} {}: unknown exception", method, path);
    }
    respond(conn, method == "HEAD", reply);
    return reply.status;  // > 0: handled; civetweb logs it as the status
  }

  static int log(const mg_connection* conn, const char* message) {
    const auto* server = static_cast<const CivetServer*>(mg_get_user_data(mg_get_context(conn)));
    if (server && server->getUserContext())
      static_cast<const MetricsEndpoint*>(server->getUserContext())->noteCivetMessage(message);
    return 1;  // handled: civetweb prints nothing
  }

 private:
  static Reply answer(const MetricsEndpoint& self, std::string_view method, std::string_view path) {
    if (path != "/metrics" && path != "/healthz" && path != "/readyz") return Reply{404, "Not Found", "not found\n"};
    if (method != "GET" && method != "HEAD")
      return Reply{405, "Method Not Allowed", "method not allowed\n", "text/plain; charset=utf-8", "Allow: GET, HEAD\r\n"};
    if (path == "/metrics") return Reply{200, "OK", self.scrape(), kMetricsContentType};
    if (path == "/healthz") return Reply{200, "OK", "ok\n"};
    if (self.ready()) return Reply{200, "OK", "ready\n"};
    return Reply{503, "Service Unavailable", "not ready\n"};
  }

  std::optional<sockaddr_in> wake_;
};

MetricsEndpoint::MetricsEndpoint(Options options, std::vector<std::weak_ptr<prometheus::Collectable>> collectables,
                                 Readiness readiness)
    : options_(std::move(options)), collectables_(std::move(collectables)), readiness_(std::move(readiness)) {
  const std::string& host = options_.bindAddress;
  const auto fail = [&](const std::string& why) {
    return ConfigError("cannot serve metrics on " + joinHostPort(host, options_.port) + ": " + why);
  };
  // civetweb reads listening_ports as a comma-separated list: one address, one port, nothing more.
  if (host.empty() || host.find_first_of(", \t") != std::string::npos) throw fail("bad bind address");
  if (options_.port < 0 || options_.port > 65535) throw fail("port out of range");
  if (options_.threads < 1 || options_.maxQueuedConnections < 1 || options_.requestTimeout.count() < 1)
    throw fail("threads, queued connections and the request timeout must be positive");
  const bool ipv6 = host.find(':') != std::string::npos;
  if (ipv6 && mg_check_feature(kCivetFeatureIpv6) == 0)
    throw fail("this civetweb (" CIVETWEB_VERSION ") is built without IPv6; use an IPv4 address");

  const std::string queue = std::to_string(options_.maxQueuedConnections);
  const std::vector<std::string> civetOptions = {
      "listening_ports", joinHostPort(host, options_.port),
      "num_threads", std::to_string(options_.threads),
      "connection_queue", queue,
      "listen_backlog", queue,
      "request_timeout_ms", std::to_string(options_.requestTimeout.count()),
      "enable_keep_alive", "no",  // a connection holds a worker: one request each, then closed
      "max_request_size", std::to_string(kMaxRequestBytes),
  };
  CivetCallbacks callbacks;
  callbacks.log_message = &Server::log;
  try {
    server_ = std::make_unique<Server>(civetOptions, callbacks, *this);
  } catch (const CivetException&) {
    std::lock_guard lock(civetMessageMutex_);
    throw fail(startFailureReason(firstCivetMessage_));
  }
  const std::vector<int> ports = server_->getListeningPorts();
  if (ports.empty()) throw fail("civetweb reports no listening port");
  port_ = ports.front();
  server_->setWakeAddress(reachableAddress(host, port_));
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

void MetricsEndpoint::noteCivetMessage(const char* message) const {
  spdlog::debug("metrics endpoint: civetweb: {}", message);
  std::lock_guard lock(civetMessageMutex_);
  if (firstCivetMessage_.empty()) firstCivetMessage_ = message;
}

}  // namespace ddprun
