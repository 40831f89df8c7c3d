// Torch's TCPStore wire protocol, as its clients speak it: the commands a client sends and the
// bytes of the answers. Both versions: torch 2.x's, which opens every connection with VALIDATE and
// a magic number, and torch 1.13's, which numbers its commands differently and has no VALIDATE.
//
// The protocol has no framing of its own: a command is its type byte, then its fields, each a
// native-endian (little-endian on every host we serve) integer or a uint64 length and that many
// bytes. It has no request id, no error reply and no credential: answers come in the order of
// the commands, except a wait's, which comes whenever its keys exist. The parser is pure (no
// socket, no store), so the fuzz target and the unit tests run it on bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::tcpstore {

// What a torch 2.x client sends after VALIDATE's type byte (0): this number, 4 bytes.
inline constexpr uint32_t kValidationMagic = 0x3C85F7CE;

// Which torch a connection speaks, told by its first bytes (detectDialect).
enum class Dialect { kUnknown, kV2, kLegacy };

// The commands, by meaning (their numbers differ between the dialects: opFromByte).
enum class Op {
  kValidate, kSet, kCompareSet, kGet, kAdd, kCheck, kWait, kNumKeys, kDelete, kAppend, kMultiGet, kMultiSet,
  kCancelWait, kPing, kQueuePush, kQueuePop, kQueueLen, kListKeys, kBarrier, kWatchKey,
};
const char* opName(Op op);
// The command of type byte `b` in `dialect`; nullopt for a byte that names none.
std::optional<Op> opFromByte(Dialect dialect, uint8_t b);

// The answers' bytes that are not values.
inline constexpr uint8_t kCheckReady = 0;
inline constexpr uint8_t kCheckNotReady = 1;
inline constexpr uint8_t kStopWaiting = 0;
inline constexpr uint8_t kWaitCanceled = 1;

// One command's fields. keys: its key (most), or keys (check, wait, multi_get, multi_set);
// values: set/append/queue_push [value], compare_set [expected, desired], multi_set one per key.
struct Command {
  Op op = Op::kSet;
  std::vector<std::string> keys;
  std::vector<std::string> values;
  int64_t number = 0;   // add's delta, barrier's world size
  uint32_t nonce = 0;   // ping's
};

struct ParseResult {
  enum class Kind { kNeedMore, kCommand, kBad };
  Kind kind = Kind::kNeedMore;
  // kCommand: the bytes the command took.
  std::size_t consumed = 0;
  // kNeedMore: how many bytes the command needs at least, as far as its fields tell so far (what a
  // server reserves for it).
  std::size_t declared = 0;
  // kBad: why (bounded, printable).
  std::string why;
};

// Tells a connection's dialect from its first bytes: a 2.x client opens with VALIDATE (0) and
// kValidationMagic; anything else is 1.13's (whose command 0 is SET: its key length, little
// endian, cannot equal the magic under kMaxStoreKeyBytes). kNeedMore until 5 bytes are here (or 1
// when it is not 0); kCommand with consumed = 5 for a 2.x VALIDATE, 0 for a 1.13 opening.
ParseResult detectDialect(std::string_view bytes, Dialect& dialect);

// Parses the one command at the start of `bytes` into `out`. kBad for a type byte that names no
// command, a key over kMaxStoreKeyBytes, a value over kMaxStoreValueBytes, more than
// kMaxStoreKeysPerRequest keys, or a command over kMaxStoreMessageBytes in all.
ParseResult parseCommand(std::string_view bytes, Dialect dialect, Command& out);

// Answers.
void appendU8(std::string& out, uint8_t v);
void appendU32(std::string& out, uint32_t v);
void appendI64(std::string& out, int64_t v);
void appendBytes(std::string& out, std::string_view bytes);  // uint64 length, the bytes

}  // namespace ddprun::tcpstore
