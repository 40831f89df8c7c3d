#include "tls/client.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>

#include <grpcpp/security/credentials.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/connect.h"
#include "common/error.h"
#include "common/net.h"
#include "common/unique_fd.h"
#include "tls/server_context.h"

namespace ddprun {
namespace {

using Clock = std::chrono::steady_clock;

std::string readPem(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw ConfigError(std::string("--rdzv_conf ") + what + " '" + path + "': cannot read it: " + std::strerror(errno));
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

int msLeft(Clock::time_point deadline) {
  return static_cast<int>(
      std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count()));
}

UniqueFd connectBy(const std::string& host, int port, Clock::time_point deadline, std::string* why) {
  Connected c = connectWithin(host, port, deadline);
  if (!c.fd) {
    *why = c.failure == Connected::Failure::kResolve   ? "cannot resolve " + host
           : c.failure == Connected::Failure::kTimeout ? "no answer"
                                                       : c.why;
  }
  return std::move(c.fd);
}

// HOST:PORT parsed and connected (*host: the host, for the certificate's name); an invalid
// fd with *why when it cannot be.
UniqueFd connectTo(const std::string& endpoint, Clock::time_point deadline, std::string* host, std::string* why) {
  int port = 0;
  try {
    std::tie(*host, port) = parseEndpoint(endpoint, 0);
  } catch (const Error& e) {
    *why = e.what();
    return UniqueFd();
  }
  return connectBy(*host, port, deadline, why);
}

// What a failed verification of the server's certificate means for the user.
std::string describeVerify(long result, const std::string& host, const TlsClientOptions& o) {
  switch (result) {
    case X509_V_ERR_CERT_HAS_EXPIRED:
      return "the server's certificate has expired";
    case X509_V_ERR_CERT_NOT_YET_VALID:
      return "the server's certificate is not valid yet";
    case X509_V_ERR_HOSTNAME_MISMATCH:
    case X509_V_ERR_IP_ADDRESS_MISMATCH:
      return "the server's certificate does not name " + host + " (its subject alternative names must)";
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
    case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
    case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
    case X509_V_ERR_CERT_SIGNATURE_FAILURE:
      return "the server's certificate is not signed by the CA in cacert" +
             (o.caCertFile.empty() ? std::string(" (none given: the system's roots)") : " ('" + o.caCertFile + "')");
    default:
      return std::string("the server's certificate: ") + X509_verify_cert_error_string(result);
  }
}

// A handshake error that means "not TLS on the other end" (a plaintext HTTP/2 server's bytes).
bool looksPlaintext(const std::string& error) {
  for (const char* s : {"wrong version number", "packet length too long", "record layer failure", "http request",
                        "unexpected eof", "unexpected message"}) {
    if (error.find(s) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

std::shared_ptr<grpc::ChannelCredentials> channelCredentials(const TlsClientOptions& o) {
  if (!o.enabled) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  if (!o.caCertFile.empty()) ssl.pem_root_certs = readPem(o.caCertFile, "cacert");
  if (o.certFile.empty() != o.keyFile.empty()) {
    throw ConfigError("--rdzv_conf: cert and key go together (a client certificate and its key)");
  }
  if (!o.certFile.empty()) {
    ssl.pem_cert_chain = readPem(o.certFile, "cert");
    ssl.pem_private_key = readPem(o.keyFile, "key");
  }
  return grpc::SslCredentials(ssl);
}

TlsProbeResult probeTls(const std::string& endpoint, const TlsClientOptions& o, std::chrono::milliseconds timeout) {
  TlsProbeResult r;
  const auto deadline = Clock::now() + timeout;
  std::string host;
  UniqueFd fd = connectTo(endpoint, deadline, &host, &r.why);
  if (!fd) return r;  // not a TLS matter: the plaintext probe says more

  ERR_clear_error();
  std::unique_ptr<SSL_CTX, void (*)(SSL_CTX*)> ctx(SSL_CTX_new(TLS_client_method()), SSL_CTX_free);
  if (!ctx) return r;
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  if (o.caCertFile.empty() ? SSL_CTX_set_default_verify_paths(ctx.get()) != 1
                           : SSL_CTX_load_verify_locations(ctx.get(), o.caCertFile.c_str(), nullptr) != 1) {
    r.configError = true;
    r.why = "cacert '" + o.caCertFile + "': " + takeOpenSslErrors("not a PEM certificate");
    return r;
  }
  if (!o.certFile.empty() && (SSL_CTX_use_certificate_chain_file(ctx.get(), o.certFile.c_str()) != 1 ||
                              SSL_CTX_use_PrivateKey_file(ctx.get(), o.keyFile.c_str(), SSL_FILETYPE_PEM) != 1 ||
                              SSL_CTX_check_private_key(ctx.get()) != 1)) {
    r.configError = true;
    r.why = "cert '" + o.certFile + "' and key '" + o.keyFile + "': " + takeOpenSslErrors();
    return r;
  }
  static const unsigned char kAlpn[] = {2, 'h', '2'};
  SSL_CTX_set_alpn_protos(ctx.get(), kAlpn, sizeof(kAlpn));
  std::unique_ptr<SSL, void (*)(SSL*)> ssl(SSL_new(ctx.get()), SSL_free);
  if (!ssl) return r;
  SSL_set_fd(ssl.get(), fd.get());
  X509_VERIFY_PARAM* param = SSL_get0_param(ssl.get());
  if (X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str()) != 1) {
    ERR_clear_error();
    SSL_set1_host(ssl.get(), host.c_str());
    SSL_set_tlsext_host_name(ssl.get(), host.c_str());
  }
  SSL_set_connect_state(ssl.get());

  // Handshake, then wait for the server's first bytes over it (gRPC's SETTINGS): with TLS 1.3 a
  // server refuses a client certificate only after the client thinks the handshake is done.
  bool handshaken = false;
  for (;;) {
    ERR_clear_error();
    int rc;
    char byte;
    std::size_t got = 0;
    if (!handshaken) {
      rc = SSL_do_handshake(ssl.get());
      if (rc == 1) {
        handshaken = true;
        continue;
      }
    } else {
      rc = SSL_read_ex(ssl.get(), &byte, 1, &got);
      if (rc == 1) {
        r.connected = true;
        return r;
      }
    }
    const int err = SSL_get_error(ssl.get(), rc);
    if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
      pollfd p{fd.get(), static_cast<short>(err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT), 0};
      if (::poll(&p, 1, msLeft(deadline)) > 0) continue;
      r.why = handshaken ? "" : "no TLS handshake within " + std::to_string(timeout.count()) + " ms";
      return r;
    }
    const std::string error = takeOpenSslErrors(err == SSL_ERROR_ZERO_RETURN || err == SSL_ERROR_SYSCALL
                                                    ? "the server closed the connection"
                                                    : "TLS error");
    const long verify = SSL_get_verify_result(ssl.get());
    r.configError = true;
    if (!handshaken && verify != X509_V_OK) {
      r.why = describeVerify(verify, host, o);
    } else if (!handshaken && looksPlaintext(error)) {
      r.why = "the server does not speak TLS (a plaintext rendezvous?): drop protocol=https, or give the "
              "server a certificate (" + error + ")";
    } else if (error.find("alert") != std::string::npos) {
      r.why = (o.certFile.empty() ? std::string("the server requires a client certificate (give cert= and key=)")
                                  : "the server refused this node's certificate '" + o.certFile +
                                        "' (not signed by its client CA, or not among its allowed names)") +
              ": " + error;
    } else {
      r.configError = false;  // a closed connection: a cap, a restart... the plaintext probe says
      r.why = error;
    }
    return r;
  }
}

bool speaksTls(const std::string& endpoint, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::string host, why;
  UniqueFd fd = connectTo(endpoint, deadline, &host, &why);
  if (!fd) return false;
  ERR_clear_error();
  std::unique_ptr<SSL_CTX, void (*)(SSL_CTX*)> ctx(SSL_CTX_new(TLS_client_method()), SSL_CTX_free);
  if (!ctx) return false;
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_NONE, nullptr);
  std::unique_ptr<SSL, void (*)(SSL*)> ssl(SSL_new(ctx.get()), SSL_free);
  if (!ssl) return false;
  SSL_set_fd(ssl.get(), fd.get());
  SSL_set_connect_state(ssl.get());
  for (;;) {
    ERR_clear_error();
    const int rc = SSL_do_handshake(ssl.get());
    if (rc == 1) return true;
    const int err = SSL_get_error(ssl.get(), rc);
    if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
      pollfd p{fd.get(), static_cast<short>(err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT), 0};
      if (::poll(&p, 1, msLeft(deadline)) > 0) continue;
      return false;
    }
    // Refused later in the handshake (TLS 1.2 and no client certificate): it sent its own first.
    const bool answered = SSL_get0_peer_certificate(ssl.get()) != nullptr;
    ERR_clear_error();
    return answered;
  }
}

}  // namespace ddprun
