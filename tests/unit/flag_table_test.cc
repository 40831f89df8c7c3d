#include "launcher/flag_table.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <catch2/catch.hpp>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "test_util.h"

using ddprun::FlagKind;
using ddprun::FlagSpec;
using ddprun::flagTable;
using ddprun::FlagValues;
using ddprun::test::ScopedEnv;

namespace {

// No variable of the table inherited from whoever runs the test.
struct CleanFlagEnv {
  std::vector<std::unique_ptr<ScopedEnv>> unset;
  CleanFlagEnv() {
    for (const FlagSpec& flag : flagTable()) {
      if (!flag.envName.empty()) unset.push_back(std::make_unique<ScopedEnv>(std::string(flag.envName), std::nullopt));
    }
  }
};

// The table on an App of its own, parsed without any validation.
struct TableApp {
  FlagValues values;  // declared first: the App holds references into it
  CLI::App app{"test"};

  TableApp() {
    ddprun::registerFlags(app, values);
    app.prefix_command();
  }
  void parse(std::vector<std::string> args) {
    std::vector<const char*> argv{"ddprun"};
    for (const auto& arg : args) argv.push_back(arg.c_str());
    app.parse(static_cast<int>(argv.size()), argv.data());
  }
  // The value that `flag` sets: its own, or the one of the flag it is an alias of.
  std::string valueOf(const FlagSpec& flag) const {
    if (flag.kind == FlagKind::kSwitch) return values.isOn(flag.name) ? "on" : "off";
    return values.text(flag.aliasOf.empty() ? flag.name : flag.aliasOf);
  }
};

std::string dashed(std::string_view name) {
  std::string text(name);
  std::replace(text.begin(), text.end(), '_', '-');
  return text;
}

}  // namespace

TEST_CASE("every flag answers to its underscore and dash spellings and its short name", "[cli][flag_table]") {
  CleanFlagEnv clean;
  for (const FlagSpec& flag : flagTable()) {
    bool isSwitch = flag.kind == FlagKind::kSwitch;
    std::vector<std::string> spellings{"--" + std::string(flag.name), "--" + dashed(flag.name)};
    if (!flag.shortName.empty()) spellings.emplace_back(flag.shortName);
    for (const auto& spelling : spellings) {
      INFO("flag " << spelling);
      TableApp t;
      if (isSwitch) t.parse({spelling, "prog"});
      else t.parse({spelling, "given-value", "prog"});
      CHECK(t.valueOf(flag) == (isSwitch ? "on" : "given-value"));
      CHECK(t.app.remaining() == std::vector<std::string>{"prog"});
    }
  }
}

TEST_CASE("every flag's environment variable is its default, and the flag overrides it", "[cli][flag_table]") {
  for (const FlagSpec& flag : flagTable()) {
    if (flag.envName.empty()) continue;
    INFO("variable " << flag.envName);
    bool isSwitch = flag.kind == FlagKind::kSwitch;
    CleanFlagEnv clean;
    ScopedEnv env(std::string(flag.envName), isSwitch ? "1" : "from-env");
    TableApp fromEnv;
    fromEnv.parse({"prog"});
    CHECK(fromEnv.valueOf(flag) == (isSwitch ? "on" : "from-env"));
    if (isSwitch) continue;
    TableApp overridden;
    overridden.parse({"--" + std::string(flag.name), "from-flag", "prog"});
    CHECK(overridden.valueOf(flag) == "from-flag");
  }
}

TEST_CASE("variables are PET_<NAME>, but LOGLEVEL and none for --dry_run and --print_completion", "[cli][flag_table]") {
  for (const FlagSpec& flag : flagTable()) {
    INFO("flag " << flag.name);
    std::string expected = "PET_" + std::string(flag.name);
    std::transform(expected.begin(), expected.end(), expected.begin(), ::toupper);
    if (flag.name == "log_level") expected = "LOGLEVEL";
    if (flag.name == "dry_run" || flag.name == "print_completion") expected = "";
    CHECK(flag.envName == expected);
  }
}

TEST_CASE("flags that are not given keep the table's defaults", "[cli][flag_table]") {
  CleanFlagEnv clean;
  TableApp t;
  t.parse({"prog"});
  for (const FlagSpec& flag : flagTable()) {
    INFO("flag " << flag.name);
    if (flag.kind == FlagKind::kSwitch) CHECK_FALSE(t.values.isOn(flag.name));
    else if (flag.aliasOf.empty()) CHECK(t.values.text(flag.name) == flag.defaultValue);
  }
  CHECK(t.values.text("nproc_per_node") == "1");
  CHECK(t.values.text("master_port") == "29500");
  CHECK(t.values.text("signals_to_handle") == "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2");
}

TEST_CASE("alias: --run_id sets --rdzv_id, with a variable of its own", "[cli][flag_table]") {
  CleanFlagEnv clean;
  TableApp flag;
  flag.parse({"--run-id", "job1", "prog"});
  CHECK(flag.values.text("rdzv_id") == "job1");
  ScopedEnv env("PET_RUN_ID", "job2");
  TableApp fromEnv;
  fromEnv.parse({"prog"});
  CHECK(fromEnv.values.text("rdzv_id") == "job2");
}

TEST_CASE("the help lists every flag with both spellings, its variable and its help", "[cli][flag_table]") {
  TableApp t;
  std::string help = t.app.help();
  for (const FlagSpec& flag : flagTable()) {
    INFO("flag " << flag.name);
    CHECK_THAT(help, Catch::Contains(ddprun::flagSpellings(flag)));
    CHECK_THAT(help, Catch::Contains("--" + dashed(flag.name)));
    if (!flag.envName.empty()) CHECK_THAT(help, Catch::Contains("(Env:" + std::string(flag.envName) + ")"));
    CHECK_THAT(help, Catch::Contains(std::string(flag.help)));
  }
  CHECK_THAT(help, Catch::Contains("-m,--module"));
  CHECK_THAT(help, Catch::Contains("--nproc_per_node,--nproc-per-node"));
}

TEST_CASE("flagGiven: on the command line or by its variable, even an empty one", "[cli][flag_table]") {
  CleanFlagEnv clean;
  TableApp none;
  none.parse({"prog"});
  CHECK_FALSE(ddprun::flagGiven(none.app, "master_port"));
  TableApp flag;
  flag.parse({"--master-port", "1234", "prog"});
  CHECK(ddprun::flagGiven(flag.app, "master_port"));
  ScopedEnv env("PET_MASTER_PORT", "");
  TableApp emptyEnv;
  emptyEnv.parse({"prog"});
  CHECK(ddprun::flagGiven(emptyEnv.app, "master_port"));
  CHECK(emptyEnv.values.text("master_port") == "29500");
}

TEST_CASE("reading a flag that is not in the table is a bug, not bad input", "[cli][flag_table]") {
  TableApp t;
  t.parse({"prog"});
  CHECK_THROWS_AS(t.values.text("no_such_flag"), ddprun::StateError);
  CHECK_THROWS_AS(t.values.text("standalone"), ddprun::StateError);  // a switch
  CHECK_THROWS_AS(t.values.isOn("nnodes"), ddprun::StateError);      // an option
}

TEST_CASE("an option followed by a flag has lost its value: refused unless written with =", "[cli][flag_table]") {
  auto check = [](std::vector<const char*> words) {
    words.insert(words.begin(), "ddprun");
    return ddprun::flagTakenAsValue(static_cast<int>(words.size()), words.data());
  };
  auto role = check({"--role", "--dry_run", "prog"});
  REQUIRE(role.has_value());
  CHECK_THAT(*role, Catch::Contains("--role needs a value") && Catch::Contains("--role=--dry_run"));
  CHECK(check({"--master-addr", "--nnodes", "2", "prog"}).has_value());  // either spelling
  CHECK(check({"-r", "--tee", "1", "prog"}).has_value());                // short names too
  CHECK_FALSE(check({"--role=--dry_run", "prog"}).has_value());           // said on purpose
  CHECK_FALSE(check({"--role", "trainer", "--dry_run", "prog"}).has_value());
  CHECK_FALSE(check({"--standalone", "--dry_run", "prog"}).has_value());  // switches take no value
  CHECK_FALSE(check({"prog", "--role", "--x"}).has_value());              // the program's own arguments
  CHECK_FALSE(check({"--", "--role", "--x"}).has_value());
  CHECK_FALSE(check({"--role"}).has_value());  // a missing value is CLI11's message
}

TEST_CASE("abbreviations: a prefix naming one flag is that flag, as argparse, an ambiguous one is an error", "[cli][flag_table]") {
  auto expand = [](std::vector<const char*> words) {
    words.insert(words.begin(), "ddprun");
    return ddprun::expandAbbreviations(static_cast<int>(words.size()), words.data());
  };
  using V = std::vector<std::string>;
  CHECK(expand({"--nproc-per", "2", "prog", "--nproc-per"}).args == V{"--nproc_per_node", "2", "prog", "--nproc-per"});
  CHECK(expand({"--nproc_per=2", "--max-re", "3", "prog"}).args == V{"--nproc_per_node=2", "--max_restarts", "3", "prog"});
  CHECK(expand({"--standa", "--dry", "prog"}).args == V{"--standalone", "--dry_run", "prog"});
  CHECK(expand({"--role", "--nproc", "prog"}).args == V{"--role", "--nproc", "prog"});  // the value of --role: flagTakenAsValue refuses it
  CHECK(expand({"--nnodes", "2", "--", "--nproc-per", "x"}).args == V{"--nnodes", "2", "--", "--nproc-per", "x"});
  CHECK(expand({"--run", "/abs/x.py"}).error == std::nullopt);  // --run_id is an alias: only --run_path starts with it
  CHECK(expand({"--unknown_flag", "prog"}).args == V{"--unknown_flag", "prog"});  // left for the parser
  auto rdzv = expand({"--rdzv", "x", "prog"});
  REQUIRE(rdzv.error.has_value());
  CHECK_THAT(*rdzv.error, Catch::Contains("ambiguous option: --rdzv could match") && Catch::Contains("--rdzv_backend") &&
                              Catch::Contains("--rdzv_endpoint"));
  CHECK(expand({"--ma=1", "prog"}).error.has_value());  // master_addr, master_port, max_restarts
  CHECK(expand({}).args.empty());
}

TEST_CASE("a repeated option takes its last value, as argparse", "[cli][flag_table]") {
  TableApp t;
  t.parse({"--role", "a", "--role=b", "--nnodes", "2", "--nnodes", "3", "prog"});
  CHECK(t.values.text("role") == "b");
  CHECK(t.values.text("nnodes") == "3");
}
