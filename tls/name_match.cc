#include "tls/name_match.h"

#include <fnmatch.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <memory>

namespace ddprun {

std::vector<std::string> certificateNames(X509* cert) {
  std::vector<std::string> names;
  if (!cert) return names;
  X509_NAME* subject = X509_get_subject_name(cert);
  for (int i = -1; (i = X509_NAME_get_index_by_NID(subject, NID_commonName, i)) >= 0;) {
    const ASN1_STRING* s = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, i));
    unsigned char* utf8 = nullptr;
    const int n = ASN1_STRING_to_UTF8(&utf8, s);
    if (n >= 0) names.emplace_back(reinterpret_cast<char*>(utf8), static_cast<std::size_t>(n));
    OPENSSL_free(utf8);
  }
  std::unique_ptr<GENERAL_NAMES, void (*)(GENERAL_NAMES*)> sans(
      static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr)),
      GENERAL_NAMES_free);
  for (int i = 0; sans && i < sk_GENERAL_NAME_num(sans.get()); ++i) {
    const GENERAL_NAME* g = sk_GENERAL_NAME_value(sans.get(), i);
    if (g->type != GEN_DNS && g->type != GEN_URI && g->type != GEN_EMAIL) continue;
    const ASN1_IA5STRING* s = g->d.ia5;
    names.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)),
                       static_cast<std::size_t>(ASN1_STRING_length(s)));
  }
  return names;
}

bool namesAllowed(const std::vector<std::string>& names, const std::vector<std::string>& patterns) {
  for (const auto& name : names) {
    // A name with an embedded NUL could match a pattern on its prefix alone.
    if (name.find('\0') != std::string::npos) continue;
    for (const auto& pattern : patterns) {
      if (::fnmatch(pattern.c_str(), name.c_str(), 0) == 0) return true;
    }
  }
  return false;
}

}  // namespace ddprun
