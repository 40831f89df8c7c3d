#include "common/build_info.h"

#include <fmt/core.h>
#include <spdlog/version.h>

#include <boost/version.hpp>

#include "ddprun_build_info.h"  // generated: cmake/WriteBuildInfo.cmake

namespace ddprun {

std::string versionText(std::string_view binary, const std::vector<std::string>& links) {
  std::string text = fmt::format("{} {}\ncommit: {}\nbuild: {}\nlinks: ", binary, DDPRUN_VERSION_STRING,
                                 DDPRUN_GIT_COMMIT, DDPRUN_BUILD_TYPE);
  for (std::size_t i = 0; i < links.size(); ++i) text += (i ? ", " : "") + links[i];
  if (links.empty()) text += "nothing but the C library";
  return text;
}

std::string_view ddprunVersion() { return DDPRUN_VERSION_STRING; }

std::vector<std::string> loggingLinks() {
#ifdef SPDLOG_COMPILED_LIB
  const char* spdlogHow = "shared";
#else
  const char* spdlogHow = "compiled in";
#endif
#ifdef FMT_HEADER_ONLY
  const char* fmtHow = "compiled in";
#else
  const char* fmtHow = "shared";
#endif
  return {fmt::format("spdlog {}.{}.{} ({})", SPDLOG_VER_MAJOR, SPDLOG_VER_MINOR, SPDLOG_VER_PATCH, spdlogHow),
          fmt::format("fmt {}.{}.{} ({})", FMT_VERSION / 10000, FMT_VERSION / 100 % 100, FMT_VERSION % 100, fmtHow)};
}

std::string boostLink() {
#ifdef DDPRUN_BOOST_STATIC
  const char* how = "compiled in";
#else
  const char* how = "shared";
#endif
  return fmt::format("Boost {}.{}.{} ({})", BOOST_VERSION / 100000, BOOST_VERSION / 100 % 1000, BOOST_VERSION % 100, how);
}

std::string cxxRuntimeLink() {
#ifdef DDPRUN_STATIC_CXX_RUNTIME
  return "libstdc++ (compiled in), libgcc_s (shared)";
#else
  return "libstdc++ (shared), libgcc_s (shared)";
#endif
}

}  // namespace ddprun
