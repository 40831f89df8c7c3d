#include "store/tcpstore/tcpstore_codec.h"

#include <bit>
#include <cstring>

#include "common/strings.h"
#include "store/core/store_limits.h"

namespace ddprun::tcpstore {

static_assert(std::endian::native == std::endian::little, "TCPStore's integers are the host's; we serve little-endian hosts");

namespace {

// Reads fields from the start of a buffer; each read is false when the bytes end first (need
// more) or a bound is broken (bad_ set).
class Cursor {
 public:
  explicit Cursor(std::string_view bytes) : bytes_(bytes) {}

  template <typename T>
  bool value(T& out) {
    need(sizeof(T));
    if (bytes_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(&out, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }

  // A uint64 length and that many bytes, at most `max`; `what` names it in the reason.
  bool string(std::string& out, std::size_t max, const char* what) {
    uint64_t len = 0;
    if (!value(len)) return false;
    if (len > max) {
      bad_ = std::string(what) + " of " + std::to_string(len) + " bytes, more than " + std::to_string(max);
      return false;
    }
    need(len);
    if (!bad_.empty()) return false;
    if (bytes_.size() - pos_ < len) return false;
    out.assign(bytes_.data() + pos_, len);
    pos_ += len;
    return true;
  }

  bool key(std::string& out) { return string(out, kMaxStoreKeyBytes, "a key"); }
  bool payload(std::string& out) { return string(out, kMaxStoreValueBytes, "a value"); }

  bool count(std::size_t& out) {
    uint64_t n = 0;
    if (!value(n)) return false;
    if (n > kMaxStoreKeysPerRequest) {
      bad_ = std::to_string(n) + " keys in one command, more than " + std::to_string(kMaxStoreKeysPerRequest);
      return false;
    }
    out = static_cast<std::size_t>(n);
    return true;
  }

  std::size_t pos() const { return pos_; }
  std::size_t declared() const { return declared_; }
  const std::string& bad() const { return bad_; }

 private:
  // The command needs `n` more bytes from here: what it declares so far, bounded in all.
  void need(std::size_t n) {
    if (pos_ + n > declared_) declared_ = pos_ + n;
    if (declared_ > kMaxStoreMessageBytes && bad_.empty()) {
      bad_ = "a command of more than " + std::to_string(kMaxStoreMessageBytes) + " bytes";
    }
  }

  std::string_view bytes_;
  std::size_t pos_ = 0;
  std::size_t declared_ = 0;
  std::string bad_;
};

bool parseFields(Cursor& c, Command& out) {
  out.keys.clear();
  out.values.clear();
  auto key = [&]() {
    out.keys.emplace_back();
    return c.key(out.keys.back());
  };
  auto payload = [&]() {
    out.values.emplace_back();
    return c.payload(out.values.back());
  };
  auto keys = [&](bool withValues) {
    std::size_t n = 0;
    if (!c.count(n)) return false;
    for (std::size_t i = 0; i < n; ++i) {
      if (!key()) return false;
      if (withValues && !payload()) return false;
    }
    return true;
  };
  switch (out.op) {
    case Op::kValidate:
    case Op::kPing:
      return c.value(out.nonce);
    case Op::kSet:
    case Op::kAppend:
    case Op::kQueuePush:
      return key() && payload();
    case Op::kCompareSet:
      return key() && payload() && payload();
    case Op::kGet:
    case Op::kDelete:
    case Op::kQueuePop:
    case Op::kQueueLen:
    case Op::kWatchKey:
      return key();
    case Op::kAdd:
    case Op::kBarrier:
      return key() && c.value(out.number);
    case Op::kCheck:
    case Op::kWait:
    case Op::kMultiGet:
      return keys(false);
    case Op::kMultiSet:
      return keys(true);
    case Op::kNumKeys:
    case Op::kCancelWait:
    case Op::kListKeys:
      return true;
  }
  return true;
}

}  // namespace

const char* opName(Op op) {
  switch (op) {
    case Op::kValidate: return "VALIDATE";
    case Op::kSet: return "SET";
    case Op::kCompareSet: return "COMPARE_SET";
    case Op::kGet: return "GET";
    case Op::kAdd: return "ADD";
    case Op::kCheck: return "CHECK";
    case Op::kWait: return "WAIT";
    case Op::kNumKeys: return "GETNUMKEYS";
    case Op::kDelete: return "DELETE_KEY";
    case Op::kAppend: return "APPEND";
    case Op::kMultiGet: return "MULTI_GET";
    case Op::kMultiSet: return "MULTI_SET";
    case Op::kCancelWait: return "CANCEL_WAIT";
    case Op::kPing: return "PING";
    case Op::kQueuePush: return "QUEUE_PUSH";
    case Op::kQueuePop: return "QUEUE_POP";
    case Op::kQueueLen: return "QUEUE_LEN";
    case Op::kListKeys: return "LIST_KEYS";
    case Op::kBarrier: return "BARRIER";
    case Op::kWatchKey: return "WATCH_KEY";
  }
  return "?";
}

std::optional<Op> opFromByte(Dialect dialect, uint8_t b) {
  if (dialect == Dialect::kLegacy) {
    // torch 1.13: SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, WATCH_KEY, DELETE_KEY.
    constexpr Op kLegacy[] = {Op::kSet,  Op::kCompareSet, Op::kGet,      Op::kAdd,   Op::kCheck,
                              Op::kWait, Op::kNumKeys,    Op::kWatchKey, Op::kDelete};
    if (b < std::size(kLegacy)) return kLegacy[b];
    return std::nullopt;
  }
  if (dialect == Dialect::kV2 && b <= static_cast<uint8_t>(Op::kBarrier)) return static_cast<Op>(b);
  return std::nullopt;
}

ParseResult detectDialect(std::string_view bytes, Dialect& dialect) {
  ParseResult r;
  if (bytes.empty()) {
    r.declared = 1;
    return r;
  }
  if (bytes[0] != 0) {
    dialect = Dialect::kLegacy;
    r.kind = ParseResult::Kind::kCommand;
    return r;
  }
  if (bytes.size() < 5) {
    r.declared = 5;
    return r;
  }
  uint32_t magic = 0;
  std::memcpy(&magic, bytes.data() + 1, sizeof magic);
  r.kind = ParseResult::Kind::kCommand;
  if (magic == kValidationMagic) {
    dialect = Dialect::kV2;
    r.consumed = 5;
  } else {
    dialect = Dialect::kLegacy;
  }
  return r;
}

ParseResult parseCommand(std::string_view bytes, Dialect dialect, Command& out) {
  ParseResult r;
  if (bytes.empty()) {
    r.declared = 1;
    return r;
  }
  const auto op = opFromByte(dialect, static_cast<uint8_t>(bytes[0]));
  if (!op) {
    r.kind = ParseResult::Kind::kBad;
    r.why = "command byte " + std::to_string(static_cast<uint8_t>(bytes[0])) + " names no TCPStore command";
    return r;
  }
  out.op = *op;
  Cursor c(bytes.substr(1));
  const bool whole = parseFields(c, out);
  if (!c.bad().empty()) {
    r.kind = ParseResult::Kind::kBad;
    r.why = std::string(opName(*op)) + ": " + c.bad();
  } else if (whole) {
    r.kind = ParseResult::Kind::kCommand;
    r.consumed = 1 + c.pos();
  } else {
    r.declared = 1 + c.declared();
  }
  return r;
}

void appendU8(std::string& out, uint8_t v) { out.push_back(static_cast<char>(v)); }

void appendU32(std::string& out, uint32_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof v); }

void appendI64(std::string& out, int64_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof v); }

void appendBytes(std::string& out, std::string_view bytes) {
  const uint64_t len = bytes.size();
  out.append(reinterpret_cast<const char*>(&len), sizeof len);
  out.append(bytes);
}

}  // namespace ddprun::tcpstore
