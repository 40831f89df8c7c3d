#include "tls/tls_session.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "common/error.h"
#include "tls/name_match.h"

namespace ddprun {

TlsSession::TlsSession(const std::shared_ptr<SSL_CTX>& context) {
  ssl_ = SSL_new(context.get());
  in_ = BIO_new(BIO_s_mem());
  out_ = BIO_new(BIO_s_mem());
  if (!ssl_ || !in_ || !out_) {
    BIO_free(in_);
    BIO_free(out_);
    SSL_free(ssl_);
    throw Error("TLS: " + takeOpenSslErrors("out of memory"));
  }
  // An empty input buffer means "more to come", not end of file.
  BIO_set_mem_eof_return(in_, -1);
  SSL_set_bio(ssl_, in_, out_);
  SSL_set_accept_state(ssl_);
}

TlsSession::~TlsSession() { SSL_free(ssl_); }

void TlsSession::feed(const char* data, std::size_t n) { BIO_write(in_, data, static_cast<int>(n)); }

TlsSession::Result TlsSession::read(char* out, std::size_t capacity, std::size_t* got) {
  *got = 0;
  mayHaveMore_ = false;
  if (!error_.empty()) return Result::kFailed;
  ERR_clear_error();
  std::size_t n = 0;
  if (SSL_read_ex(ssl_, out, capacity, &n) == 1) {
    *got = n;
    mayHaveMore_ = true;
    return Result::kData;
  }
  switch (SSL_get_error(ssl_, 0)) {
    case SSL_ERROR_WANT_READ:
    case SSL_ERROR_WANT_WRITE:
      return Result::kWantMore;
    case SSL_ERROR_ZERO_RETURN:
      return Result::kClosed;
    default: {
      error_ = takeOpenSslErrors("the TLS session failed");
      const long verify = SSL_get_verify_result(ssl_);
      if (verify != X509_V_OK) {
        error_ += std::string(" (the client's certificate: ") + X509_verify_cert_error_string(verify) + ")";
      }
      return Result::kFailed;
    }
  }
}

std::size_t TlsSession::write(const char* data, std::size_t n) {
  if (!established() || !error_.empty() || n == 0) return 0;
  std::size_t written = 0;
  ERR_clear_error();
  if (SSL_write_ex(ssl_, data, n, &written) != 1) return 0;
  return written;
}

void TlsSession::takeOutput(std::vector<char>& out) {
  const std::size_t n = BIO_ctrl_pending(out_);
  if (n == 0) return;
  const std::size_t at = out.size();
  out.resize(at + n);
  const int read = BIO_read(out_, out.data() + at, static_cast<int>(n));
  out.resize(at + static_cast<std::size_t>(std::max(read, 0)));
}

void TlsSession::shutdown() {
  if (established()) SSL_shutdown(ssl_);
}

bool TlsSession::established() const { return SSL_is_init_finished(ssl_) == 1; }

std::string TlsSession::peerNames() const {
  X509* cert = SSL_get1_peer_certificate(ssl_);
  if (!cert) return "";
  std::string out;
  for (const auto& n : certificateNames(cert)) out += (out.empty() ? "" : ", ") + n;
  X509_free(cert);
  return out;
}

}  // namespace ddprun
