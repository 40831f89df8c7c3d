#include "launcher/scheduler/slurm_hostlist.h"

#include <catch2/catch.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"

using ddprun::ConfigError;
using ddprun::expandSlurmHostlist;
using Catch::Contains;

namespace {

struct HostlistCase {
  const char* expression;
  const char* scontrol;         // what scontrol printed (see the .inc file for the format)
  const char* ours = nullptr;   // where ddprun deliberately answers otherwise
};

#define HOSTLIST_CASE(...) HostlistCase{__VA_ARGS__},
const HostlistCase kCases[] = {
#include "slurm_hostlist_cases.inc"
};
#undef HOSTLIST_CASE

// Our expansion in the table's format.
std::string answer(const char* expression) {
  std::vector<std::string> hosts;
  try {
    hosts = expandSlurmHostlist(expression);
  } catch (const ConfigError&) {
    return "invalid";
  }
  std::ostringstream out;
  if (hosts.size() > 16) {
    out << hosts.size() << " hosts: " << hosts.front() << " .. " << hosts.back();
    return out.str();
  }
  for (std::size_t i = 0; i < hosts.size(); ++i) out << (i ? " " : "") << hosts[i];
  return out.str();
}

}  // namespace

TEST_CASE("hostlist: the recorded table of scontrol's answers, at least 50 of them agreed", "[slurm][hostlist]") {
  int agreed = 0;
  for (const auto& c : kCases) {
    INFO("expression: '" << c.expression << "', scontrol: " << c.scontrol);
    CHECK(answer(c.expression) == (c.ours ? c.ours : c.scontrol));
    if (!c.ours) ++agreed;
  }
  CHECK(agreed >= 50);
}

TEST_CASE("hostlist: padding, lists and cross products spelled out", "[slurm][hostlist]") {
  using V = std::vector<std::string>;
  CHECK(expandSlurmHostlist("n[008-011]") == V{"n008", "n009", "n010", "n011"});
  CHECK(expandSlurmHostlist("a[1,3-4],b") == V{"a1", "a3", "a4", "b"});
  CHECK(expandSlurmHostlist("rack[0-1]-b[1-2]") == V{"rack0-b1", "rack0-b2", "rack1-b1", "rack1-b2"});
  CHECK(expandSlurmHostlist("gpu-node.dc1,x-[1-2]") == V{"gpu-node.dc1", "x-1", "x-2"});
  CHECK(expandSlurmHostlist("").empty());
}

TEST_CASE("hostlist: a malformed expression says what is wrong", "[slurm][hostlist]") {
  CHECK_THROWS_WITH(expandSlurmHostlist("n[1-"), Contains("'[' without ']'"));
  CHECK_THROWS_WITH(expandSlurmHostlist("n]1"), Contains("']' without '['"));
  CHECK_THROWS_WITH(expandSlurmHostlist("n[[1]]"), Contains("'[' inside a bracket group"));
  CHECK_THROWS_WITH(expandSlurmHostlist("n[3-1]"), Contains("range '3-1' runs backwards"));
  CHECK_THROWS_WITH(expandSlurmHostlist("n[a-b]"), Contains("'a-b' is not a number"));
  CHECK_THROWS_WITH(expandSlurmHostlist("n[1-2]-ib"), Contains("'-ib' follows the last ']'"));
  CHECK_THROWS_WITH(expandSlurmHostlist("n[3-1]"), Contains("hostlist 'n[3-1]'"));
}

TEST_CASE("hostlist: the host count is bounded before anything is built", "[slurm][hostlist]") {
  // Each of these would be gigabytes (or forever) without the bound; the error comes at once.
  CHECK_THROWS_WITH(expandSlurmHostlist("n[0-99999999]"), Contains("more than 65536 hosts"));
  CHECK_THROWS_WITH(expandSlurmHostlist("n[0-999999999999999999]"), Contains("more than 65536 hosts"));
  CHECK_THROWS_WITH(expandSlurmHostlist("a[0-9999]b[0-9999]c[0-9999]"), Contains("more than 65536 hosts"));
  CHECK_THROWS_WITH(expandSlurmHostlist("a[0-40000],b[0-40000]"), Contains("more than 65536 hosts"));
  CHECK(expandSlurmHostlist("n[1-65536]").size() == 65536);
  CHECK(expandSlurmHostlist("a[1-4]b[1-4]", 16).size() == 16);
  CHECK_THROWS_WITH(expandSlurmHostlist("a[1-4]b[1-4],c", 16), Contains("more than 16 hosts"));
}
