// ddprun's flags as data: one row per flag, registered on a CLI::App by registerFlags. Adding a
// flag is one row in flag_table.cc (plus the code that reads its value).
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace CLI {
class App;
}  // namespace CLI

namespace ddprun {

enum class FlagKind { kOption, kSwitch };

struct FlagSpec {
  std::string_view name;          // torchrun's spelling without "--"; "a-b" works as well as "a_b"
  std::string_view shortName;     // "-m", or empty
  std::string_view envName;       // the default comes from this variable, PET_<NAME>; empty: none
  std::string_view defaultValue;  // when neither the flag nor its variable is given; options only
  FlagKind kind = FlagKind::kOption;
  std::string_view help;
  std::string_view aliasOf = {};  // another flag whose value this one sets (--run_id: rdzv_id)
};

// Every flag, in --help order.
std::span<const FlagSpec> flagTable();

// What CLI11 registers: "-r,--redirects" or "--nproc_per_node,--nproc-per-node".
std::string flagSpellings(const FlagSpec& flag);

// The values given on the command line or by environment variables, else the defaults; filled in
// by CLI::App::parse after registerFlags. Reading a name that is not in the table is a bug.
class FlagValues {
 public:
  FlagValues() = default;
  FlagValues(const FlagValues&) = delete;  // CLI11 holds references into it
  FlagValues& operator=(const FlagValues&) = delete;

  const std::string& text(std::string_view name) const;  // an option's value as typed
  bool isOn(std::string_view name) const;                 // a switch

 private:
  friend void registerFlags(CLI::App& app, FlagValues& values);
  std::map<std::string, std::string, std::less<>> texts_;
  std::map<std::string, bool, std::less<>> switches_;
};

// Registers every row of flagTable() on `app`, storing into `values`, which must outlive the parse.
void registerFlags(CLI::App& app, FlagValues& values);

// Before the parse: an option written as two words ("--role VALUE") whose VALUE starts with "--"
// most likely lost its value to the next flag ("--role --dry_run prog" would run with role
// "--dry_run"). Returns the error message for the first such option, nullopt when there is none.
// "--role=--x" says it on purpose and is accepted. Scanning stops at the program (the first word
// that is not a flag or an option's value) or at "--".
std::optional<std::string> flagTakenAsValue(int argc, const char* const* argv);

// argparse's abbreviations, as torchrun accepts them: before the program, a long flag may be cut to
// any prefix that names one flag ("--nproc-per 2" is "--nproc-per-node 2"; '-' and '_' are the
// same letter, as in the two spellings; an alias such as --run_id is matched only in full).
// Returns argv[1..] with each such prefix written out in full, or the error for an ambiguous one
// ("--rdzv" could be four flags). Unknown flags are left for the parser to report.
struct ExpandedArgs {
  std::vector<std::string> args;
  std::optional<std::string> error;
};
ExpandedArgs expandAbbreviations(int argc, const char* const* argv);

// A shell completion script of every flag for "bash", "zsh" or "tcsh" (--print_completion);
// throws ConfigError for another shell.
std::string completionScript(const std::string& shell);

// Whether the flag was on the command line or its variable is set, even to "" (after the parse).
bool flagGiven(const CLI::App& app, std::string_view name);

}  // namespace ddprun
