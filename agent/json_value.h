// A small JSON reader for the one JSON document the agent reads: torchrun's error file, written by
// a worker's @record decorator. Enough of RFC 8259 to read any valid document (objects, arrays,
// strings with every escape, numbers, true/false/null) and to reject invalid ones; kept here
// instead of protobuf's JSON parser so that the single-node agent maps no protobuf library.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace ddprun::json {

struct Value;
using Object = std::map<std::string, Value, std::less<>>;
using Array = std::vector<Value>;

struct Value {
  // null, bool, number, string, array, object
  std::variant<std::monostate, bool, double, std::string, Array, Object> data;

  const std::string* asString() const { return std::get_if<std::string>(&data); }
  const double* asNumber() const { return std::get_if<double>(&data); }
  const Object* asObject() const { return std::get_if<Object>(&data); }
  // The member `name` of an object; nullptr when this is no object or has no such member.
  const Value* member(std::string_view name) const;
};

// The document in text, or nullopt when it is not valid JSON (or nests deeper than 128 levels,
// so a hostile file cannot exhaust the stack).
std::optional<Value> parse(std::string_view text);

}  // namespace ddprun::json
