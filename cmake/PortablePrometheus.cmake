# prometheus-cpp's core as a static library, for the portable build (the wheel; docs/install.md):
# Debian ships the library shared only, and the shared one needs the system's libstdc++.so.6, which
# the wheel's binaries must not. Compiled from Debian's source package of the installed
# prometheus-cpp-dev (scripts/prometheus_source.sh unpacks it; scripts/package.sh passes it), so it
# is the code and the headers of the .deb's build. Only the core: the HTTP server is Boost.Beast's
# (metrics/), so pull (civetweb), push (curl) and compression (zlib) are not needed.
#
# In: DDPRUN_PROMETHEUS_SOURCE_DIR, the environment variable (what scripts/package.sh sets; it wins
# when set, so a build folder follows the source it is handed) or the cache variable.
# Out: the target prometheus-cpp::core, as find_package(prometheus-cpp) would give it.
#
# Its own small target rather than add_subdirectory() of the source: that would bring the source's
# install rules (headers, the archive, its CMake package) into the wheel's install and CPack, and its
# C++11 setting; the core is a fixed list of .cc files and one generated header.
set(DDPRUN_PROMETHEUS_SOURCE_DIR "" CACHE PATH
  "prometheus-cpp's source (Debian's source package) whose core DDPRUN_PORTABLE compiles in")
if(NOT "$ENV{DDPRUN_PROMETHEUS_SOURCE_DIR}" STREQUAL "")
  set(DDPRUN_PROMETHEUS_SOURCE_DIR "$ENV{DDPRUN_PROMETHEUS_SOURCE_DIR}" CACHE PATH
    "prometheus-cpp's source (Debian's source package) whose core DDPRUN_PORTABLE compiles in" FORCE)
endif()
if(NOT DDPRUN_PROMETHEUS_SOURCE_DIR)
  message(FATAL_ERROR
    "DDPRUN_PORTABLE needs prometheus-cpp's source for the metrics port: set DDPRUN_PROMETHEUS_SOURCE_DIR to the "
    "folder `bash scripts/prometheus_source.sh BUILD_DIR` prints (scripts/package.sh wheel does this), or build "
    "without the metrics port with -DDDPRUN_WITH_METRICS=OFF (docs/install.md)")
endif()
set(_ddprun_prom ${DDPRUN_PROMETHEUS_SOURCE_DIR}/core)
if(NOT EXISTS ${_ddprun_prom}/src/registry.cc OR NOT EXISTS ${_ddprun_prom}/include/prometheus/registry.h)
  message(FATAL_ERROR "DDPRUN_PROMETHEUS_SOURCE_DIR=${DDPRUN_PROMETHEUS_SOURCE_DIR} is not prometheus-cpp's source "
    "(no core/src/registry.cc or core/include/prometheus/registry.h)")
endif()
file(STRINGS ${DDPRUN_PROMETHEUS_SOURCE_DIR}/CMakeLists.txt _ddprun_prom_version_line REGEX "^  VERSION [0-9.]+$")
string(STRIP "${_ddprun_prom_version_line}" _ddprun_prom_version_line)
message(STATUS "prometheus-cpp: core compiled in from ${DDPRUN_PROMETHEUS_SOURCE_DIR} (${_ddprun_prom_version_line})")

# The core's own list (core/CMakeLists.txt's add_library(core ...)) is every .cc under core/src.
file(GLOB _ddprun_prom_sources CONFIGURE_DEPENDS ${_ddprun_prom}/src/*.cc ${_ddprun_prom}/src/detail/*.cc)
add_library(ddprun_prometheus_core STATIC ${_ddprun_prom_sources})
add_library(prometheus-cpp::core ALIAS ddprun_prometheus_core)
# Before /usr/include, where prometheus-cpp-dev's copy of the same headers lies.
target_include_directories(ddprun_prometheus_core
  PUBLIC ${_ddprun_prom}/include ${CMAKE_CURRENT_BINARY_DIR}/prometheus-cpp/include
  PRIVATE ${_ddprun_prom}/src)
# Threads, as upstream links it; not rt (in libc since glibc 2.34) nor libatomic (x86_64 has 64-bit
# atomics without it; upstream's CheckAtomic finds the same).
target_link_libraries(ddprun_prometheus_core PRIVATE Threads::Threads)
# prometheus/detail/core_export.h, made as upstream's core/CMakeLists.txt makes it (same base name).
include(GenerateExportHeader)
generate_export_header(ddprun_prometheus_core
  BASE_NAME prometheus-cpp-core
  EXPORT_FILE_NAME ${CMAKE_CURRENT_BINARY_DIR}/prometheus-cpp/include/prometheus/detail/core_export.h)
