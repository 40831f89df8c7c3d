// ddprun's command line: torchrun's flags in both spellings, PET_<FLAG> environment defaults.
#pragma once

#include <functional>
#include <string>

#include "launcher/launch_config.h"

namespace ddprun {

struct ParseResult {
  enum class Kind { kRun, kExit } kind = Kind::kRun;
  int exitStatus = 0;   // for kExit: 0 after --help/--version, 2 after an error
  LaunchConfig config;  // for kRun
};

// Parses and validates argv. Errors are printed as one line to stderr (exit status 2); --help and
// --version print to stdout. `environ` supplies PET_* and PYTHON_EXEC; nothing is started.
// What --version prints (common/build_info.h): each binary says what it links. A function, so that
// a launch that does not ask for it does not pay for composing it.
using VersionText = std::function<std::string()>;

// versionText: none prints "ddprun".
ParseResult parseCommandLine(int argc, const char* const* argv, const VersionText& versionText = {});

}  // namespace ddprun
