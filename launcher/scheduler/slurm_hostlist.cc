#include "launcher/scheduler/slurm_hostlist.h"

#include <cstdint>

#include "common/error.h"
#include "common/strings.h"

namespace ddprun {
namespace {

// 18 digits always fit in uint64_t, so no range arithmetic below can overflow.
constexpr std::size_t kMaxDigits = 18;

struct Number {
  uint64_t value = 0;
  std::size_t width = 0;  // zero-padded to this many digits
};

// One name with bracket groups: prefixes[i] comes before groups[i].
struct Pattern {
  std::vector<std::string> prefixes;
  std::vector<std::vector<Number>> groups;
};

class Expander {
 public:
  Expander(std::string_view expression, std::size_t maxHosts) : expression_(expression), maxHosts_(maxHosts) {}

  std::vector<std::string> run() {
    std::size_t start = 0;
    int depth = 0;
    for (std::size_t i = 0; i <= expression_.size(); ++i) {
      char c = i < expression_.size() ? expression_[i] : ',';
      if (c == '[') {
        if (depth > 0) fail("'[' inside a bracket group");
        depth = 1;
      } else if (c == ']') {
        if (depth == 0) fail("']' without '['");
        depth = 0;
      } else if (depth == 0 && (c == ',' || c == ' ' || c == '\t' || c == '\n')) {
        if (i > start) expandName(expression_.substr(start, i - start));
        start = i + 1;
      }
    }
    if (depth > 0) fail("'[' without ']'");
    return std::move(hosts_);
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw ConfigError("hostlist '" + printable(expression_, 200) + "': " + why);
  }

  void expandName(std::string_view name) {
    if (name.find('[') == std::string_view::npos) {
      add(std::string(name));
      return;
    }
    Pattern pattern;
    std::size_t pos = 0;
    while (pos < name.size()) {
      std::size_t open = name.find('[', pos);
      if (open == std::string_view::npos) {
        // Slurm refuses text after the last group ("n[1-2]-ib"); so do we, for the same answers.
        fail("'" + printable(name.substr(pos), 64) + "' follows the last ']' of '" + printable(name, 64) + "'");
      }
      std::size_t close = name.find(']', open);  // run() checked that it exists
      pattern.prefixes.emplace_back(name.substr(pos, open - pos));
      pattern.groups.push_back(parseGroup(name.substr(open + 1, close - open - 1)));
      pos = close + 1;
    }
    expandPattern(pattern);
  }

  std::vector<Number> parseGroup(std::string_view group) {
    std::vector<Number> values;
    for (const std::string& range : split(group, ',')) {
      auto dash = range.find('-');
      Number lo = parseNumber(range.substr(0, dash), range);
      Number hi = dash == std::string::npos ? lo : parseNumber(range.substr(dash + 1), range);
      if (hi.value < lo.value) fail("range '" + printable(range, 64) + "' runs backwards");
      if (hi.value - lo.value >= maxHosts_ || values.size() + (hi.value - lo.value) >= maxHosts_) tooMany();
      for (uint64_t v = lo.value; v <= hi.value; ++v) values.push_back(Number{v, lo.width});
    }
    return values;
  }

  Number parseNumber(const std::string& digits, const std::string& range) {
    if (digits.empty() || digits.size() > kMaxDigits ||
        digits.find_first_not_of("0123456789") != std::string::npos) {
      fail("'" + printable(range, 64) + "' is not a number or a LO-HI range of numbers (up to " + std::to_string(kMaxDigits) +
           " digits)");
    }
    return Number{std::stoull(digits), digits.size()};
  }

  static std::string format(const Number& n) {
    std::string digits = std::to_string(n.value);
    return digits.size() < n.width ? std::string(n.width - digits.size(), '0') + digits : digits;
  }

  // Slurm's order: the last group varies fastest; each earlier group is then applied, from the
  // second last to the first, to every name built so far ("n[1-2]x[3-4]y[5-6]" gives n1x3y5
  // n1x3y6 n2x3y5 n2x3y6 n1x4y5 ...). The count is checked before anything is built.
  void expandPattern(const Pattern& p) {
    std::size_t count = 1;
    for (const auto& group : p.groups) {
      if (count > (maxHosts_ - hosts_.size()) / group.size()) tooMany();
      count *= group.size();
    }
    std::vector<std::string> stems{p.prefixes.back()};
    for (std::size_t g = p.groups.size() - 1; g-- > 0;) {
      std::vector<std::string> next;
      next.reserve(stems.size() * p.groups[g].size());
      for (const auto& stem : stems) {
        for (const auto& n : p.groups[g]) next.push_back(p.prefixes[g] + format(n) + stem);
      }
      stems = std::move(next);
    }
    for (const auto& stem : stems) {
      for (const auto& n : p.groups.back()) add(stem + format(n));
    }
  }

  void add(std::string host) {
    if (hosts_.size() >= maxHosts_) tooMany();
    hosts_.push_back(std::move(host));
  }

  [[noreturn]] void tooMany() const {
    fail("more than " + std::to_string(maxHosts_) + " hosts (ddprun's bound, the same as Slurm's for one range)");
  }

  std::string_view expression_;
  std::size_t maxHosts_;
  std::vector<std::string> hosts_;
};

}  // namespace

std::vector<std::string> expandSlurmHostlist(std::string_view expression, std::size_t maxHosts) {
  return Expander(expression, maxHosts).run();
}

}  // namespace ddprun
