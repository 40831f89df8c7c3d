#include "agent/json_value.h"

#include <cstdlib>

namespace ddprun::json {
namespace {

constexpr int kMaxDepth = 128;

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  std::optional<Value> document() {
    Value v;
    if (!value(&v, 0)) return std::nullopt;
    skipSpace();
    if (pos_ != text_.size()) return std::nullopt;
    return v;
  }

 private:
  bool value(Value* out, int depth) {
    if (depth > kMaxDepth) return false;
    skipSpace();
    if (pos_ >= text_.size()) return false;
    switch (text_[pos_]) {
      case '{': return object(out, depth);
      case '[': return array(out, depth);
      case '"': {
        std::string s;
        if (!string(&s)) return false;
        out->data = std::move(s);
        return true;
      }
      case 't': return literal("true", out, true);
      case 'f': return literal("false", out, false);
      case 'n': return literal("null", out, std::monostate{});
      default: return number(out);
    }
  }

  bool object(Value* out, int depth) {
    Object obj;
    ++pos_;  // '{'
    skipSpace();
    if (consume('}')) {
      out->data = std::move(obj);
      return true;
    }
    while (true) {
      skipSpace();
      std::string key;
      if (!string(&key)) return false;
      skipSpace();
      if (!consume(':')) return false;
      Value member;
      if (!value(&member, depth + 1)) return false;
      obj.insert_or_assign(std::move(key), std::move(member));  // the last duplicate wins
      skipSpace();
      if (consume('}')) break;
      if (!consume(',')) return false;
    }
    out->data = std::move(obj);
    return true;
  }

  bool array(Value* out, int depth) {
    Array arr;
    ++pos_;  // '['
    skipSpace();
    if (consume(']')) {
      out->data = std::move(arr);
      return true;
    }
    while (true) {
      Value item;
      if (!value(&item, depth + 1)) return false;
      arr.push_back(std::move(item));
      skipSpace();
      if (consume(']')) break;
      if (!consume(',')) return false;
    }
    out->data = std::move(arr);
    return true;
  }

  bool string(std::string* out) {
    if (!consume('"')) return false;
    while (pos_ < text_.size()) {
      char c = text_[pos_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return false;  // control characters must be escaped
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (pos_ >= text_.size()) return false;
      switch (text_[pos_++]) {
        case '"': out->push_back('"'); break;
        case '\\': out->push_back('\\'); break;
        case '/': out->push_back('/'); break;
        case 'b': out->push_back('\b'); break;
        case 'f': out->push_back('\f'); break;
        case 'n': out->push_back('\n'); break;
        case 'r': out->push_back('\r'); break;
        case 't': out->push_back('\t'); break;
        case 'u': {
          uint32_t cp = 0;
          if (!hex4(&cp)) return false;
          if (cp >= 0xD800 && cp <= 0xDBFF) {  // a high surrogate: its low half must follow
            uint32_t low = 0;
            if (!consume('\\') || !consume('u') || !hex4(&low) || low < 0xDC00 || low > 0xDFFF) return false;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            return false;
          }
          appendUtf8(cp, out);
          break;
        }
        default: return false;
      }
    }
    return false;  // unterminated
  }

  bool hex4(uint32_t* out) {
    if (pos_ + 4 > text_.size()) return false;
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = text_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f') v |= static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= static_cast<uint32_t>(c - 'A' + 10);
      else return false;
    }
    *out = v;
    return true;
  }

  static void appendUtf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  // RFC 8259's grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
  bool number(Value* out) {
    const size_t start = pos_;
    consume('-');
    if (consume('0')) {
    } else if (!digits()) {
      return false;
    }
    if (consume('.') && !digits()) return false;
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      ++pos_;
      if (!consume('+')) consume('-');
      if (!digits()) return false;
    }
    out->data = std::strtod(std::string(text_.substr(start, pos_ - start)).c_str(), nullptr);
    return true;
  }

  bool digits() {
    const size_t start = pos_;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
    return pos_ > start;
  }

  template <typename T>
  bool literal(std::string_view word, Value* out, T v) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    out->data = v;
    return true;
  }

  bool consume(char c) {
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  void skipSpace() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  std::string_view text_;
  size_t pos_ = 0;
};

}  // namespace

const Value* Value::member(std::string_view name) const {
  const Object* obj = asObject();
  if (!obj) return nullptr;
  auto it = obj->find(name);
  return it == obj->end() ? nullptr : &it->second;
}

std::optional<Value> parse(std::string_view text) { return Parser(text).document(); }

}  // namespace ddprun::json
