// Whether a client certificate is one a server lets in (TlsServerOptions::allowedNames).
#pragma once

#include <string>
#include <vector>

typedef struct x509_st X509;

namespace ddprun {

// The names a certificate goes by: its subject's common name, then each DNS, URI and e-mail
// subject alternative name.
std::vector<std::string> certificateNames(X509* cert);

// Whether any of `names` matches any of `patterns` (fnmatch(3), '*' and '?'; case-sensitive).
bool namesAllowed(const std::vector<std::string>& names, const std::vector<std::string>& patterns);

}  // namespace ddprun
