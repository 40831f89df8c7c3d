// TLS terminated in the connection relay, with real sockets and OpenSSL clients (socket pairs stand
// in for the client's TCP connection; no gRPC): plaintext reaches gRPC's side both ways, larger
// than the relay's buffers, and close_notify ends it; the frame limits hold inside TLS; handshakes
// take turns per address and time out; a client certificate must carry an allowed name.
#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "netguard/connection_relay.h"
#include "relay_test_util.h"
#include "tls/name_match.h"
#include "tls/server_context.h"

using ddprun::AbuseLimits;
using ddprun::ConnectionRelay;
using ddprun::RelayTls;
using ddprun::TlsServerContext;
using ddprun::TlsServerOptions;
using ddprun::UniqueFd;
using ddprun::test::frame;
using ddprun::test::kPreface;
using ddprun::test::makePair;
using ddprun::test::Pair;
using ddprun::test::readUpTo;
using ddprun::test::writeAll;
using namespace std::chrono_literals;

namespace {

namespace fs = std::filesystem;

// A self-signed P-256 certificate (its own CA) with subjectAltName `san`, as PEM files in `dir`.
struct Cert {
  std::string cert, key;
};

Cert makeCert(const fs::path& dir, const std::string& name, const std::string& cn, const std::string& san) {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  REQUIRE(key);
  X509* x = X509_new();
  X509_set_version(x, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(x), static_cast<long>(std::hash<std::string>{}(name) & 0x7fffffff));
  X509_gmtime_adj(X509_getm_notBefore(x), -3600);
  X509_gmtime_adj(X509_getm_notAfter(x), 86400);
  X509_set_pubkey(x, key);
  X509_NAME* subject = X509_get_subject_name(x);
  X509_NAME_add_entry_by_txt(subject, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1,
                             0);
  X509_set_issuer_name(x, subject);
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, x, x, nullptr, nullptr, 0);
  for (const auto& [nid, value] : {std::pair{NID_subject_alt_name, san}, std::pair{NID_basic_constraints, std::string("CA:TRUE")}}) {
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
    REQUIRE(ext);
    X509_add_ext(x, ext, -1);
    X509_EXTENSION_free(ext);
  }
  REQUIRE(X509_sign(x, key, EVP_sha256()) > 0);
  Cert out{(dir / (name + ".pem")).string(), (dir / (name + ".key")).string()};
  FILE* f = std::fopen(out.cert.c_str(), "w");
  PEM_write_X509(f, x);
  std::fclose(f);
  f = std::fopen(out.key.c_str(), "w");
  PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr);
  std::fclose(f);
  X509_free(x);
  EVP_PKEY_free(key);
  return out;
}

struct Pki {
  fs::path dir;
  Cert server, nodeA, intruder;
  Pki() {
    char tmpl[] = "/tmp/ddprun_tls_relay_XXXXXX";
    REQUIRE(::mkdtemp(tmpl));
    dir = tmpl;
    server = makeCert(dir, "server", "ddprun-rdzv", "DNS:localhost");
    nodeA = makeCert(dir, "node_a", "node-a", "DNS:node-a.job1.example,URI:spiffe://job1/node-a");
    intruder = makeCert(dir, "intruder", "intruder", "DNS:intruder.elsewhere.example");
  }
  ~Pki() { fs::remove_all(dir); }
};

// A blocking OpenSSL client on `fd` that trusts `ca` and offers ALPN h2 (and `cert`, for mTLS).
struct Client {
  SSL_CTX* ctx = nullptr;
  SSL* ssl = nullptr;
  Client(int fd, const std::string& ca, const Cert* cert = nullptr) {
    // OpenSSL writes with write(2): a connection the relay cut must fail the write, not kill the
    // test with SIGPIPE.
    static const bool ignored = std::signal(SIGPIPE, SIG_IGN) != SIG_ERR;
    (void)ignored;
    ctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_load_verify_locations(ctx, ca.c_str(), nullptr);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
    static const unsigned char kAlpn[] = {2, 'h', '2'};
    SSL_CTX_set_alpn_protos(ctx, kAlpn, sizeof(kAlpn));
    if (cert) {
      SSL_CTX_use_certificate_file(ctx, cert->cert.c_str(), SSL_FILETYPE_PEM);
      SSL_CTX_use_PrivateKey_file(ctx, cert->key.c_str(), SSL_FILETYPE_PEM);
    }
    ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
  }
  ~Client() {
    SSL_free(ssl);
    SSL_CTX_free(ctx);
  }
  bool connect() { return SSL_connect(ssl) == 1; }
  bool write(const std::string& data) {
    std::size_t done = 0;
    while (done < data.size()) {
      std::size_t n = 0;
      if (SSL_write_ex(ssl, data.data() + done, data.size() - done, &n) != 1) return false;
      done += n;
    }
    return true;
  }
  // Reads until `want` bytes came, or the end (*end: close_notify or an error).
  std::string read(std::size_t want, bool* end = nullptr) {
    std::string out;
    char buf[65536];
    while (out.size() < want) {
      std::size_t n = 0;
      if (SSL_read_ex(ssl, buf, sizeof(buf), &n) != 1) {
        if (end) *end = true;
        break;
      }
      out.append(buf, n);
    }
    return out;
  }
};

std::shared_ptr<TlsServerContext> serverContext(const Pki& pki, const std::string& clientCa = "",
                                                std::vector<std::string> allowed = {}) {
  TlsServerOptions o;
  o.certFile = pki.server.cert;
  o.keyFile = pki.server.key;
  o.clientCaFile = clientCa;
  o.allowedNames = std::move(allowed);
  return std::make_shared<TlsServerContext>(o);
}

// Failures the relay reported (its onFailure), safe to read from the test's thread.
struct Failures {
  std::mutex mu;
  std::vector<std::string> whys;
  // A slow log sink: a failure must be told before its connection closes, so that whoever sees
  // the close also finds the reason (CI once saw the EOF first).
  std::chrono::milliseconds sinkDelay{0};
  RelayTls tls(std::shared_ptr<TlsServerContext> context) {
    RelayTls t;
    t.context = std::move(context);
    t.onFailure = [this](const std::string& address, const std::string& why) {
      std::this_thread::sleep_for(sinkDelay);
      std::lock_guard<std::mutex> lock(mu);
      whys.push_back(address + ": " + why);
    };
    return t;
  }
  std::string all() {
    std::lock_guard<std::mutex> lock(mu);
    std::string out;
    for (const auto& w : whys) out += w + "\n";
    return out;
  }
  // What was reported for connections from `address`, a line each, without the address.
  std::string of(const std::string& address) {
    std::lock_guard<std::mutex> lock(mu);
    std::string out;
    for (const auto& w : whys) {
      if (w.rfind(address + ": ", 0) == 0) out += w.substr(address.size() + 2) + "\n";
    }
    return out;
  }
};

// The relay's counters once `done` holds for them; fails the test after the safety bound.
template <typename Predicate>
ddprun::ConnectionRelayStats statsWhen(const ConnectionRelay& relay, Predicate done) {
  const auto deadline = std::chrono::steady_clock::now() + ddprun::test::kSafetyBound;
  for (;;) {
    const auto stats = relay.stats();
    if (done(stats)) return stats;
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(1ms);
  }
}

}  // namespace

TEST_CASE("TLS in the relay: plaintext on gRPC's side both ways, larger than the buffers, then close_notify",
          "[rendezvous][relay][tls]") {
  Pki pki;
  Failures failures;
  ConnectionRelay relay(AbuseLimits{}, {}, nullptr, failures.tls(serverContext(pki)));
  Pair pair = makePair();
  auto added = relay.add(std::move(pair.relay), "192.0.2.9", true);
  REQUIRE(added.grpcSide);
  const int server = added.grpcSide.get();
  Client client(pair.test.get(), pki.server.cert);
  REQUIRE(client.connect());
  CHECK(std::string(SSL_get_version(client.ssl)) == "TLSv1.3");

  std::string up = kPreface + frame(0x1, 1, 20);
  while (up.size() < (2u << 20)) up += frame(0x0, 1, 16000);
  auto wrote = std::async(std::launch::async, [&] { return client.write(up); });
  CHECK(readUpTo(server, up.size()) == up);
  CHECK(wrote.get());

  std::string down;
  while (down.size() < (2u << 20)) down += std::to_string(down.size()) + ",";
  auto serverWrote = std::async(std::launch::async, [&] { return writeAll(server, down); });
  CHECK(client.read(down.size()) == down);
  CHECK(serverWrote.get());

  // gRPC ends its side: the client gets close_notify (a clean end, not an error).
  ::shutdown(server, SHUT_WR);
  bool end = false;
  CHECK(client.read(1, &end).empty());
  CHECK(end);
  CHECK(SSL_get_error(client.ssl, 0) == SSL_ERROR_ZERO_RETURN);
  CHECK(failures.all().empty());
}

TEST_CASE("TLS in the relay: a stream flood inside TLS is cut before gRPC reads it", "[rendezvous][relay][tls]") {
  Pki pki;
  Failures failures;
  AbuseLimits limits;
  limits.callBurst = 10;
  limits.callsPerSecond = 1;
  std::atomic<int> cut{0};
  ConnectionRelay relay(limits, {}, [&](const std::string&, const std::string&) { ++cut; },
                        failures.tls(serverContext(pki)));
  Pair pair = makePair();
  auto added = relay.add(std::move(pair.relay), "192.0.2.9", true);
  Client client(pair.test.get(), pki.server.cert);
  REQUIRE(client.connect());
  std::string flood = kPreface;
  for (uint32_t s = 1; s < 200; s += 2) flood += frame(0x1, s, 10);
  client.write(flood);  // may fail part way: the relay cuts it
  bool eof = false;
  const std::string passed = readUpTo(added.grpcSide.get(), flood.size(), &eof);
  CHECK(eof);
  CHECK(passed.size() < flood.size());
  CHECK(cut == 1);
  CHECK(relay.stats().closedForAbuse == 1);
}

TEST_CASE("TLS in the relay: handshakes take turns per address, and one that stalls gives its turn up",
          "[rendezvous][relay][tls]") {
  Pki pki;
  Failures failures;
  RelayTls tls = failures.tls(serverContext(pki));
  tls.maxHandshakesPerAddress = 1;
  tls.handshakeTimeout = 30s;  // the stalled one goes at its grace, long before this
  tls.stallGrace = 1000ms;
  ConnectionRelay relay(AbuseLimits{}, {}, nullptr, tls);

  // The first connection of 192.0.2.9 starts a handshake and stalls: it holds the address's turn.
  Pair stalled = makePair();
  auto a = relay.add(std::move(stalled.relay), "192.0.2.9", true);
  REQUIRE(writeAll(stalled.test.get(), std::string("\x16\x03\x01\x02\x00\x01", 6)));

  // A second from the same address waits its turn; one from another address does not.
  Pair second = makePair();
  auto b = relay.add(std::move(second.relay), "192.0.2.9", true);
  Pair other = makePair();
  auto c = relay.add(std::move(other.relay), "192.0.2.10", true);
  // Counted, not timed (a busy machine stretches any time): the relay's counters when the second
  // client's handshake ended tell whether it had waited for the stalled one's turn to end.
  auto secondDone = std::async(std::launch::async, [&] {
    Client client(second.test.get(), pki.server.cert);
    const bool ok = client.connect();
    return std::pair{ok, relay.stats()};
  });
  Client otherClient(other.test.get(), pki.server.cert);
  CHECK(otherClient.connect());
  // Only the second waited for a turn: the other address's handshake started at once.
  CHECK(statsWhen(relay, [](const auto& s) { return s.tlsEstablished >= 1; }).tlsQueued == 1);

  // The stalled handshake, silent while another of its address waits, gives its turn up (closed,
  // reported) after its grace; the second gets the turn and completes.
  bool eof = false;
  readUpTo(stalled.test.get(), 1 << 20, &eof);
  CHECK(eof);
  REQUIRE(secondDone.wait_for(ddprun::test::kSafetyBound) == std::future_status::ready);
  const auto [ok, whenSecondDone] = secondDone.get();
  CHECK(ok);                               // it waited for the turn, not refused,
  CHECK(whenSecondDone.tlsFailed == 1);    // and got it only when the stalled one had gone
  CHECK_THAT(failures.all(), Catch::Contains("192.0.2.9: its TLS handshake sent nothing for 1000 ms while other "
                                             "connections from its address waited their turn"));
  const auto stats = statsWhen(relay, [](const auto& s) { return s.tlsEstablished == 2; });
  CHECK(stats.tlsFailed == 1);
  CHECK(stats.tlsQueued == 1);
  (void)a;
  (void)b;
  (void)c;
}

TEST_CASE("TLS in the relay: mTLS lets in only a client certificate with an allowed name",
          "[rendezvous][relay][tls]") {
  Pki pki;
  // Both client certificates are their own CA; the server trusts both, but allows node-* only.
  const std::string bundle = (pki.dir / "clients.pem").string();
  {
    std::ofstream out(bundle);
    for (const auto* c : {&pki.nodeA, &pki.intruder}) out << std::ifstream(c->cert).rdbuf();
  }
  Failures failures;
  failures.sinkDelay = 200ms;
  ConnectionRelay relay(AbuseLimits{}, {}, nullptr,
                        failures.tls(serverContext(pki, bundle, {"node-*.job1.example"})));

  Pair good = makePair();
  auto g = relay.add(std::move(good.relay), "192.0.2.9", true);
  Client nodeA(good.test.get(), pki.server.cert, &pki.nodeA);
  REQUIRE(nodeA.connect());
  REQUIRE(nodeA.write(kPreface));
  CHECK(readUpTo(g.grpcSide.get(), kPreface.size()) == kPreface);

  // TLS 1.3: the client finishes its side first, then hears the server's refusal.
  Pair bad = makePair();
  auto b = relay.add(std::move(bad.relay), "192.0.2.9", true);
  Client intruder(bad.test.get(), pki.server.cert, &pki.intruder);
  intruder.connect();
  intruder.write(kPreface);
  bool end = false;
  intruder.read(1, &end);
  CHECK(end);
  bool eof = false;
  CHECK(readUpTo(b.grpcSide.get(), 1, &eof).empty());  // nothing of it reached gRPC
  CHECK(eof);
  CHECK_THAT(failures.all(), Catch::Contains("certificate rejected"));

  // Without a certificate at all: refused too, before anything of it reaches gRPC.
  Pair none = makePair();
  auto n = relay.add(std::move(none.relay), "192.0.2.10", true);  // its own address: its own log line
  Client anonymous(none.test.get(), pki.server.cert);
  anonymous.connect();
  anonymous.write(kPreface);
  end = false;
  anonymous.read(1, &end);
  CHECK(end);
  eof = false;
  CHECK(readUpTo(n.grpcSide.get(), 1, &eof).empty());
  CHECK(eof);
  CHECK_THAT(failures.of("192.0.2.10"), Catch::Contains("peer did not return a certificate"));
  CHECK(relay.stats().tlsFailed == 2);
}

TEST_CASE("allowed names: a certificate's CN and SANs against shell patterns", "[tls]") {
  Pki pki;
  FILE* f = std::fopen(pki.nodeA.cert.c_str(), "r");
  X509* x = PEM_read_X509(f, nullptr, nullptr, nullptr);
  std::fclose(f);
  REQUIRE(x);
  const auto names = ddprun::certificateNames(x);
  X509_free(x);
  CHECK(names == std::vector<std::string>{"node-a", "node-a.job1.example", "spiffe://job1/node-a"});
  CHECK(ddprun::namesAllowed(names, {"node-?"}));
  CHECK(ddprun::namesAllowed(names, {"other", "*.job1.example"}));
  CHECK(ddprun::namesAllowed(names, {"spiffe://job1/*"}));
  CHECK_FALSE(ddprun::namesAllowed(names, {"*.job2.example", "node-b"}));
  CHECK_FALSE(ddprun::namesAllowed(names, {}));
  CHECK_FALSE(ddprun::namesAllowed({std::string("node-a\0.evil", 11)}, {"node-a*"}));
}
