#include "tls/server_context.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <spdlog/spdlog.h>

#include <cstring>
#include <ctime>
#include <fstream>

#include "common/error.h"
#include "tls/name_match.h"

namespace ddprun {
namespace {

// The context's allowed names, for the verify callback (SSL_CTX ex_data, freed with the context).
int allowedNamesIndex() {
  static const int index = SSL_CTX_get_ex_new_index(
      0, nullptr, nullptr, nullptr, [](void*, void* p, CRYPTO_EX_DATA*, int, long, void*) {
        delete static_cast<std::vector<std::string>*>(p);
      });
  return index;
}

// Rejects, at the leaf, a client certificate that names none of the allowed names. OpenSSL then
// sends the client a bad_certificate alert: it hears why instead of a closed connection.
int verifyClient(int preverified, X509_STORE_CTX* store) {
  if (!preverified || X509_STORE_CTX_get_error_depth(store) != 0) return preverified;
  auto* ssl = static_cast<SSL*>(X509_STORE_CTX_get_ex_data(store, SSL_get_ex_data_X509_STORE_CTX_idx()));
  const auto* allowed =
      static_cast<const std::vector<std::string>*>(SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), allowedNamesIndex()));
  if (!allowed || allowed->empty()) return 1;
  if (namesAllowed(certificateNames(X509_STORE_CTX_get_current_cert(store)), *allowed)) return 1;
  X509_STORE_CTX_set_error(store, X509_V_ERR_CERT_REJECTED);
  return 0;
}

// gRPC's clients insist on ALPN "h2": a server that does not choose it is refused.
int selectH2(SSL*, const unsigned char** out, unsigned char* outLen, const unsigned char* in, unsigned int inLen,
             void*) {
  for (unsigned int i = 0; i < inLen;) {
    const unsigned int n = in[i];
    if (i + 1 + n > inLen) break;
    if (n == 2 && std::memcmp(in + i + 1, "h2", 2) == 0) {
      *out = in + i + 1;
      *outLen = 2;
      return SSL_TLSEXT_ERR_OK;
    }
    i += 1 + n;
  }
  return SSL_TLSEXT_ERR_ALERT_FATAL;
}

std::string utcText(const ASN1_TIME* t) {
  std::tm tm{};
  if (!t || ASN1_TIME_to_tm(t, &tm) != 1) return "an unreadable date";
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

// Loaded all the same (a clock may be wrong, the operator may be replacing it), but said at once:
// every client would refuse the handshake, each saying only that the certificate has expired.
void warnIfOutOfDate(X509* cert, const std::string& path) {
  if (!cert) return;
  if (X509_cmp_current_time(X509_get0_notAfter(cert)) < 0) {
    spdlog::warn("TLS certificate '{}' expired on {}: every client will refuse it; renew it (SIGHUP reloads the files)",
                 path, utcText(X509_get0_notAfter(cert)));
  } else if (X509_cmp_current_time(X509_get0_notBefore(cert)) > 0) {
    spdlog::warn("TLS certificate '{}' is not valid before {}: clients will refuse it until then (or check this "
                 "host's clock)",
                 path, utcText(X509_get0_notBefore(cert)));
  }
}

void requireReadable(const std::string& path, const char* what) {
  if (path.empty()) throw ConfigError(std::string(what) + ": no file given");
  std::ifstream f(path);
  if (!f) throw ConfigError(std::string(what) + " '" + path + "': cannot read it: " + std::strerror(errno));
}

std::shared_ptr<SSL_CTX> makeContext(const TlsServerOptions& o) {
  requireReadable(o.certFile, "TLS certificate");
  requireReadable(o.keyFile, "TLS key");
  ERR_clear_error();
  std::shared_ptr<SSL_CTX> ctx(SSL_CTX_new(TLS_server_method()), SSL_CTX_free);
  if (!ctx) throw ConfigError("TLS: " + takeOpenSslErrors("cannot make an OpenSSL context"));
  SSL_CTX* c = ctx.get();
  SSL_CTX_set_min_proto_version(c, TLS1_2_VERSION);
  // Nothing to resume across connections; no renegotiation (a CPU cost a client could repeat).
  SSL_CTX_set_options(c, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_TICKET | SSL_OP_CIPHER_SERVER_PREFERENCE);
  SSL_CTX_set_session_cache_mode(c, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_num_tickets(c, 0);
  SSL_CTX_set_mode(c, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_RELEASE_BUFFERS);
  if (SSL_CTX_use_certificate_chain_file(c, o.certFile.c_str()) != 1) {
    throw ConfigError("TLS certificate '" + o.certFile + "': " + takeOpenSslErrors("not a PEM certificate"));
  }
  if (SSL_CTX_use_PrivateKey_file(c, o.keyFile.c_str(), SSL_FILETYPE_PEM) != 1) {
    const std::string why = takeOpenSslErrors("not a PEM private key");
    if (why.find("key values mismatch") != std::string::npos) {
      throw ConfigError("TLS key '" + o.keyFile + "' is not the key of the certificate '" + o.certFile + "' (" + why +
                        ")");
    }
    throw ConfigError("TLS key '" + o.keyFile + "': " + why);
  }
  if (SSL_CTX_check_private_key(c) != 1) {
    throw ConfigError("TLS key '" + o.keyFile + "' is not the key of the certificate '" + o.certFile + "': " +
                      takeOpenSslErrors());
  }
  warnIfOutOfDate(SSL_CTX_get0_certificate(c), o.certFile);
  SSL_CTX_set_alpn_select_cb(c, selectH2, nullptr);
  if (!o.clientCaFile.empty()) {
    requireReadable(o.clientCaFile, "TLS client CA");
    if (SSL_CTX_load_verify_locations(c, o.clientCaFile.c_str(), nullptr) != 1) {
      throw ConfigError("TLS client CA '" + o.clientCaFile + "': " + takeOpenSslErrors("not a PEM certificate"));
    }
    STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(o.clientCaFile.c_str());
    if (names) SSL_CTX_set_client_CA_list(c, names);
    SSL_CTX_set_verify(c, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, verifyClient);
    // A client certificate must be one for clients (or for no purpose in particular).
    X509_VERIFY_PARAM_set_purpose(SSL_CTX_get0_param(c), X509_PURPOSE_SSL_CLIENT);
    SSL_CTX_set_ex_data(c, allowedNamesIndex(), new std::vector<std::string>(o.allowedNames));
  } else if (!o.allowedNames.empty()) {
    throw ConfigError("allowed names need a client CA (mTLS): only a client certificate names a client");
  }
  return ctx;
}

}  // namespace

std::string takeOpenSslErrors(const std::string& fallback) {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? fallback : out;
}

TlsServerContext::TlsServerContext(TlsServerOptions options)
    : options_(std::move(options)), ctx_(makeContext(options_)) {}

TlsServerContext::~TlsServerContext() = default;

void TlsServerContext::reload() {
  auto fresh = makeContext(options_);
  std::lock_guard<std::mutex> lock(mu_);
  ctx_ = std::move(fresh);
}

std::shared_ptr<SSL_CTX> TlsServerContext::current() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ctx_;
}

}  // namespace ddprun
