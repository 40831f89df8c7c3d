// Which libddp this is: for a bug report, and for a C++ user to check at run time that the library
// they load has the NCCL backend (it is a build option: docs/install.md).
#pragma once

#include <string>

namespace ddp {

// "libddp VERSION (commit C, BUILD_TYPE); backends: gloo, nccl" (or "nccl not built in").
std::string buildInfo();

// libddp's version, "MAJOR.MINOR.PATCH".
std::string version();

}  // namespace ddp
