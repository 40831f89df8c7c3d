// What `--version` prints, the same way for every ddprun binary: the version, the git commit, the
// build type, and what the binary links (libraries and whether each is compiled in or shared), so
// that a bug report says exactly which build it came from.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ddprun {

// "NAME VERSION\ncommit: ...\nbuild: ...\nlinks: A, B, ..." (no final line end: CLI11 adds it).
std::string versionText(std::string_view binary, const std::vector<std::string>& links);

// "0.1.0": the project's version, for messages other than --version (the Status call's server name).
std::string_view ddprunVersion();

// spdlog and fmt, as this build has them ("spdlog 1.10.0 (shared)" or "(compiled in)").
std::vector<std::string> loggingLinks();
// Boost, for the binaries that use it (Boost.JSON, Boost.Filesystem).
std::string boostLink();
// The C++ runtime: libstdc++ shared, or compiled in (DDPRUN_PORTABLE's -static-libstdc++).
std::string cxxRuntimeLink();

}  // namespace ddprun
