#include "etcd/etcd_client.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "common/backoff.h"
#include "common/error.h"
#include "common/strings.h"

namespace ddprun {

using etcdserverpb::KV;
using etcdserverpb::Lease;

struct EtcdClient::Member {
  std::string endpoint;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<KV::Stub> kv;
  std::unique_ptr<Lease::Stub> lease;
  std::unique_ptr<etcdserverpb::Watch::Stub> watch;
  std::unique_ptr<etcdserverpb::Maintenance::Stub> maintenance;
  std::unique_ptr<etcdserverpb::Auth::Stub> auth;
};

namespace {

std::string readFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(std::string("etcd ") + what + " '" + path + "' cannot be read");
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::shared_ptr<grpc::ChannelCredentials> credentials(const EtcdClientOptions& o) {
  if (!o.tls) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  if (!o.caCertFile.empty()) ssl.pem_root_certs = readFile(o.caCertFile, "cacert");
  if (!o.certFile.empty()) ssl.pem_cert_chain = readFile(o.certFile, "cert");
  if (!o.keyFile.empty()) ssl.pem_private_key = readFile(o.keyFile, "key");
  return grpc::SslCredentials(ssl);
}

std::shared_ptr<grpc::Channel> makeEtcdChannel(const std::string& endpoint, const EtcdClientOptions& o) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(o.maxMessageBytes);
  args.SetMaxSendMessageSize(o.maxMessageBytes);
  // Our backoff (jittered, across members) paces retries, not gRPC's 1 s first reconnect delay.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // A member that died without closing its connections (host gone) fails a watch within ~8 s.
  // etcd's server answers pings no more often than every 5 s (--grpc-keepalive-min-time) with
  // GOAWAY, so not below that.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 3000);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // Each endpoint has a channel of its own: without this gRPC would share one subchannel
  // between clients in a process, and a test's "other client" would not be another connection.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(endpoint, credentials(o), args);
}

bool retryable(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE || s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

thread_local std::mt19937_64 tlsRng{std::random_device{}()};

}  // namespace

std::string etcdPrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    auto& c = reinterpret_cast<unsigned char&>(end.back());
    if (c < 0xff) {
      ++c;
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key (etcd's convention for "no end")
}

std::vector<std::string> parseEtcdEndpoints(const std::string& text) {
  std::vector<std::string> out;
  for (auto item : split(text, ',')) {
    std::string e(trim(item));
    if (e.empty()) continue;
    for (const char* scheme : {"http://", "https://", "etcd://"}) {
      if (startsWith(e, scheme)) e = e.substr(std::string_view(scheme).size());
    }
    if (!e.empty() && e.back() == '/') e.pop_back();
    // host, host:port, [v6], [v6]:port
    bool hasPort = e.rfind(':') != std::string::npos && (e[0] != '[' || e.rfind(']') < e.rfind(':'));
    if (!hasPort) e += ":2379";
    out.push_back(e);
  }
  if (out.empty()) throw ConfigError("etcd endpoints '" + text + "': expected HOST[:PORT][,HOST[:PORT]...]");
  return out;
}

void throwEtcdError(const char* what, const grpc::Status& s) {
  std::string msg = std::string("etcd ") + what + ": " + s.error_message();
  switch (s.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
      throw ConnectionError(msg);
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      throw TimeoutError(msg);
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED:
      throw ConfigError(msg);
    default:
      throw StateError(msg);
  }
}

EtcdClient::EtcdClient(EtcdClientOptions options) : options_(std::move(options)) {
  if (options_.endpoints.empty()) throw ConfigError("etcd: no endpoints");
  for (const auto& e : options_.endpoints) {
    auto m = std::make_unique<Member>();
    m->endpoint = e;
    m->channel = makeEtcdChannel(e, options_);
    m->kv = KV::NewStub(m->channel);
    m->lease = Lease::NewStub(m->channel);
    m->watch = etcdserverpb::Watch::NewStub(m->channel);
    m->maintenance = etcdserverpb::Maintenance::NewStub(m->channel);
    m->auth = etcdserverpb::Auth::NewStub(m->channel);
    members_.push_back(std::move(m));
  }
  // Start on a random member, so that many clients spread over the cluster.
  current_ = options_.firstEndpoint >= 0
                 ? static_cast<std::size_t>(options_.firstEndpoint) % members_.size()
                 : std::uniform_int_distribution<std::size_t>(0, members_.size() - 1)(tlsRng);
  if (!options_.user.empty()) authenticate();
}

EtcdClient::~EtcdClient() = default;

std::size_t EtcdClient::currentEndpoint() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return current_;
}

void EtcdClient::markFailed(std::size_t endpoint) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (current_ == endpoint) current_ = (current_ + 1) % members_.size();
}

etcdserverpb::Watch::Stub& EtcdClient::watchStub(std::size_t endpoint) { return *members_.at(endpoint)->watch; }

void EtcdClient::prepare(grpc::ClientContext& context) {
  std::string token;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    token = authToken_;
  }
  if (!token.empty()) context.AddMetadata("token", token);
  // etcd cancels a watch on a member that has lost its leader (instead of leaving it silent),
  // so the watch moves to a member that is part of the quorum.
  context.AddMetadata("hasleader", "true");
}

void EtcdClient::call(const char* what,
                      const std::function<grpc::Status(Member&, grpc::ClientContext&)>& attempt) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + options_.retryTimeout;
  Backoff backoff(std::chrono::milliseconds(10), std::chrono::milliseconds(500));
  bool reauthenticated = false;
  for (;;) {
    std::size_t index = currentEndpoint();
    grpc::ClientContext context;
    prepare(context);
    auto remaining = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    context.set_deadline(std::chrono::system_clock::now() +
                         std::clamp(remaining, std::chrono::milliseconds(1), options_.callTimeout));
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (cancelled_) throw ClosedError(std::string("etcd ") + what + ": the client was closed");
      inFlight_.insert(&context);
    }
    grpc::Status s = attempt(*members_[index], context);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      inFlight_.erase(&context);
      if (cancelled_) throw ClosedError(std::string("etcd ") + what + ": the client was closed");
    }
    if (s.ok()) return;
    if (!options_.user.empty() && !reauthenticated && s.error_message().find("invalid auth token") != std::string::npos) {
      reauthenticated = true;  // tokens expire (etcd's simple tokens after 5 minutes idle)
      authenticate();
      continue;
    }
    if (s.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
      const std::string& endpoint = members_[index]->endpoint;
      throw NotEtcdError(endpoint, s.error_message(),
                         std::string("etcd ") + what + ": " + endpoint + " does not serve etcd's v3 API (" +
                             (s.error_message().empty() ? "UNIMPLEMENTED" : s.error_message()) + ")");
    }
    if (!retryable(s)) throwEtcdError(what, s);
    markFailed(index);
    if (Clock::now() >= deadline) {
      throw ConnectionError(std::string("etcd ") + what + ": no member answered within " +
                            std::to_string(options_.retryTimeout.count()) + " ms (last: " + members_[index]->endpoint +
                            ": " + s.error_message() + ")");
    }
    // Jittered: clients that lost the same member do not all hit the next one at once.
    std::unique_lock<std::mutex> lock(mutex_);
    cancelCv_.wait_for(lock, std::min<Clock::duration>(backoff.next(), deadline - Clock::now()),
                       [this] { return cancelled_; });
  }
}

void EtcdClient::cancel() {
  std::lock_guard<std::mutex> lock(mutex_);
  cancelled_ = true;
  for (grpc::ClientContext* context : inFlight_) context->TryCancel();
  cancelCv_.notify_all();
}

void EtcdClient::authenticate() {
  etcdserverpb::AuthenticateRequest req;
  req.set_name(options_.user);
  req.set_password(options_.password);
  etcdserverpb::AuthenticateResponse resp;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    authToken_.clear();
  }
  try {
    call("authenticate", [&](Member& m, grpc::ClientContext& c) { return m.auth->Authenticate(&c, req, &resp); });
  } catch (const StateError& e) {
    // etcd answers wrong credentials with INVALID_ARGUMENT: a configuration error (exit 2).
    throw ConfigError(std::string(e.what()) + " (user '" + options_.user + "')");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  authToken_ = resp.token();
}

std::optional<EtcdKeyValue> EtcdClient::get(const std::string& key, int64_t* revision) {
  etcdserverpb::RangeRequest req;
  req.set_key(key);
  etcdserverpb::RangeResponse resp;
  call("get", [&](Member& m, grpc::ClientContext& c) { return m.kv->Range(&c, req, &resp); });
  if (revision) *revision = resp.header().revision();
  if (resp.kvs_size() == 0) return std::nullopt;
  const auto& kv = resp.kvs(0);
  return EtcdKeyValue{kv.key(), kv.value(), kv.create_revision(), kv.mod_revision(), kv.version(), kv.lease()};
}

std::vector<EtcdKeyValue> EtcdClient::getPrefix(const std::string& prefix, int64_t* revision, int64_t atRevision) {
  etcdserverpb::RangeRequest req;
  req.set_key(prefix);
  req.set_range_end(etcdPrefixEnd(prefix));
  if (atRevision > 0) req.set_revision(atRevision);
  etcdserverpb::RangeResponse resp;
  call("get prefix", [&](Member& m, grpc::ClientContext& c) { return m.kv->Range(&c, req, &resp); });
  if (revision) *revision = resp.header().revision();
  std::vector<EtcdKeyValue> out;
  for (const auto& kv : resp.kvs()) {
    out.push_back({kv.key(), kv.value(), kv.create_revision(), kv.mod_revision(), kv.version(), kv.lease()});
  }
  return out;
}

int64_t EtcdClient::countPrefix(const std::string& prefix) {
  etcdserverpb::RangeRequest req;
  req.set_key(prefix);
  req.set_range_end(etcdPrefixEnd(prefix));
  req.set_count_only(true);
  etcdserverpb::RangeResponse resp;
  call("count", [&](Member& m, grpc::ClientContext& c) { return m.kv->Range(&c, req, &resp); });
  return resp.count();
}

int64_t EtcdClient::put(const std::string& key, const std::string& value, int64_t lease) {
  etcdserverpb::PutRequest req;
  req.set_key(key);
  req.set_value(value);
  req.set_lease(lease);
  etcdserverpb::PutResponse resp;
  call("put", [&](Member& m, grpc::ClientContext& c) { return m.kv->Put(&c, req, &resp); });
  return resp.header().revision();
}

int64_t EtcdClient::deleteKey(const std::string& key) {
  etcdserverpb::DeleteRangeRequest req;
  req.set_key(key);
  etcdserverpb::DeleteRangeResponse resp;
  call("delete", [&](Member& m, grpc::ClientContext& c) { return m.kv->DeleteRange(&c, req, &resp); });
  return resp.deleted();
}

int64_t EtcdClient::deletePrefix(const std::string& prefix) {
  etcdserverpb::DeleteRangeRequest req;
  req.set_key(prefix);
  req.set_range_end(etcdPrefixEnd(prefix));
  etcdserverpb::DeleteRangeResponse resp;
  call("delete prefix", [&](Member& m, grpc::ClientContext& c) { return m.kv->DeleteRange(&c, req, &resp); });
  return resp.deleted();
}

etcdserverpb::TxnResponse EtcdClient::txn(const etcdserverpb::TxnRequest& request) {
  etcdserverpb::TxnResponse resp;
  call("txn", [&](Member& m, grpc::ClientContext& c) { return m.kv->Txn(&c, request, &resp); });
  return resp;
}

int64_t EtcdClient::grantLease(std::chrono::seconds ttl) {
  etcdserverpb::LeaseGrantRequest req;
  req.set_ttl(ttl.count());
  etcdserverpb::LeaseGrantResponse resp;
  call("lease grant", [&](Member& m, grpc::ClientContext& c) { return m.lease->LeaseGrant(&c, req, &resp); });
  if (!resp.error().empty()) throw StateError("etcd lease grant: " + resp.error());
  return resp.id();
}

int64_t EtcdClient::leaseTimeToLive(int64_t id) {
  etcdserverpb::LeaseTimeToLiveRequest req;
  req.set_id(id);
  etcdserverpb::LeaseTimeToLiveResponse resp;
  call("lease time to live", [&](Member& m, grpc::ClientContext& c) { return m.lease->LeaseTimeToLive(&c, req, &resp); });
  return resp.ttl();
}

void EtcdClient::revokeLease(int64_t id) {
  etcdserverpb::LeaseRevokeRequest req;
  req.set_id(id);
  etcdserverpb::LeaseRevokeResponse resp;
  try {
    call("lease revoke", [&](Member& m, grpc::ClientContext& c) { return m.lease->LeaseRevoke(&c, req, &resp); });
  } catch (const StateError& e) {
    if (std::string(e.what()).find("lease not found") == std::string::npos) throw;
  }
}

int64_t EtcdClient::keepAliveOnce(int64_t id) {
  int64_t ttl = 0;
  call("lease keepalive", [&](Member& m, grpc::ClientContext& c) {
    auto stream = m.lease->LeaseKeepAlive(&c);
    etcdserverpb::LeaseKeepAliveRequest req;
    req.set_id(id);
    etcdserverpb::LeaseKeepAliveResponse resp;
    if (!stream->Write(req) || !stream->Read(&resp)) {
      // The call is over (member gone, deadline): Finish says why. Cancelling first would turn
      // every such failure into CANCELLED, which is not retried on another member.
      grpc::Status s = stream->Finish();
      return s.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "keepalive stream ended") : s;
    }
    ttl = resp.ttl();
    stream->WritesDone();
    c.TryCancel();  // one answer is all we wanted
    stream->Finish();
    return grpc::Status::OK;
  });
  return ttl;
}

etcdserverpb::StatusResponse EtcdClient::status(std::size_t endpoint) {
  grpc::ClientContext c;
  prepare(c);
  c.set_deadline(std::chrono::system_clock::now() + options_.callTimeout);
  etcdserverpb::StatusResponse resp;
  grpc::Status s = members_.at(endpoint)->maintenance->Status(&c, etcdserverpb::StatusRequest(), &resp);
  if (!s.ok()) throwEtcdError("status", s);
  return resp;
}

}  // namespace ddprun
