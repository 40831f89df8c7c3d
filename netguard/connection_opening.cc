#include "netguard/connection_opening.h"

#include <algorithm>

namespace ddprun {

Opening classifyOpening(std::string_view peeked, const OpeningRules& rules) {
  if (rules.tls) {
    // A TLS record starts with its type, 22 for a handshake.
    if (!peeked.empty() && peeked[0] == 0x16) return Opening::kTlsHandshake;
    if (peeked.size() < 4) return Opening::kNeedMore;
    return peeked.substr(0, 4) == "PRI " ? Opening::kPlaintextOnTls : Opening::kNotTls;
  }
  const std::string_view magic = rules.sideMagic;
  if (!magic.empty() && !peeked.empty() &&
      peeked.substr(0, std::min(peeked.size(), magic.size())) == magic.substr(0, std::min(peeked.size(), magic.size()))) {
    return peeked.size() >= magic.size() ? Opening::kSideProtocol : Opening::kNeedMore;
  }
  return peeked.size() >= kHttp2PrefaceBytes ? Opening::kHttp2 : Opening::kNeedMore;
}

}  // namespace ddprun
