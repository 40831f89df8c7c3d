# DDPRUN_STATIC_GRPC: link gRPC, protobuf and their dependencies (absl, re2, upb, c-ares,
# address_sorting, OpenSSL, zlib) into the executables that opt in, from the static archives that
# Debian's -dev packages ship. glibc, libstdc++, spdlog and fmt stay shared (no -static: a static
# glibc breaks getaddrinfo/NSS). Loading ~50 shared libraries costs a multi-node agent several ms of
# CPU per start (bench/RESULTS_MULTINODE.md); libddp and the tests keep the shared libraries.
#
#   ddprun_link_grpc_statically(<executable>...)  opt an executable in (a no-op when the option is OFF)
#
# How: ddprun::grpc stands for gRPC + protobuf and resolves per executable being linked: the static
# archives (one rescanned link group, the order `pkg-config --static grpc++ protobuf` lists) where
# that executable's DDPRUN_STATIC_GRPC property is set, else gRPC::grpc++ and protobuf::libprotobuf
# as before (plus absl::synchronization, which rpc/grpc_runtime.cc calls directly). So no link mixes the .so and the .a of one library.
find_package(gRPC CONFIG REQUIRED)
find_package(PkgConfig QUIET)
# tls/ calls OpenSSL directly: the shared one with the shared gRPC, else the archive gRPC links.
find_package(OpenSSL REQUIRED)

set(_ddprun_static_grpc_found FALSE)
if(PKG_CONFIG_FOUND)
  pkg_check_modules(DDPRUN_GRPC_PC QUIET grpc++ protobuf)
endif()
if(DDPRUN_GRPC_PC_FOUND)
  set(_ddprun_static_grpc_found TRUE)
  set(_ddprun_static_grpc_archives)
  set(_ddprun_static_grpc_system)
  list(REMOVE_DUPLICATES DDPRUN_GRPC_PC_STATIC_LIBRARIES)
  foreach(name IN LISTS DDPRUN_GRPC_PC_STATIC_LIBRARIES)
    if(name MATCHES "^(dl|m|rt|pthread|atomic)$")
      list(APPEND _ddprun_static_grpc_system ${name})  # part of the toolchain: stays shared
      continue()
    endif()
    find_library(DDPRUN_STATIC_${name} NAMES lib${name}.a HINTS ${DDPRUN_GRPC_PC_STATIC_LIBRARY_DIRS})
    mark_as_advanced(DDPRUN_STATIC_${name})
    if(NOT DDPRUN_STATIC_${name})
      set(_ddprun_static_grpc_found FALSE)
      set(_ddprun_static_grpc_missing lib${name}.a)
      break()
    endif()
    list(APPEND _ddprun_static_grpc_archives ${DDPRUN_STATIC_${name}})
  endforeach()
else()
  set(_ddprun_static_grpc_missing "pkg-config data for grpc++ and protobuf")
endif()

option(DDPRUN_STATIC_GRPC "Link gRPC and protobuf statically into ddprun-multinode and ddprun-rdzv"
  ${_ddprun_static_grpc_found})
if(DDPRUN_STATIC_GRPC AND NOT _ddprun_static_grpc_found)
  message(FATAL_ERROR "DDPRUN_STATIC_GRPC=ON but ${_ddprun_static_grpc_missing} was not found")
elseif(DDPRUN_STATIC_GRPC)
  list(LENGTH _ddprun_static_grpc_archives _ddprun_static_grpc_count)
  message(STATUS "DDPRUN_STATIC_GRPC: ON (${_ddprun_static_grpc_count} static archives)")
elseif(_ddprun_static_grpc_found)
  message(STATUS "DDPRUN_STATIC_GRPC: OFF (set to ON to link gRPC statically)")
else()
  message(STATUS "DDPRUN_STATIC_GRPC: OFF (${_ddprun_static_grpc_missing} not found)")
endif()

add_library(ddprun_grpc INTERFACE)
add_library(ddprun::grpc ALIAS ddprun_grpc)
if(DDPRUN_STATIC_GRPC)
  list(JOIN _ddprun_static_grpc_archives "," _ddprun_static_grpc_group)
  target_link_libraries(ddprun_grpc INTERFACE
    "$<IF:$<BOOL:$<TARGET_PROPERTY:DDPRUN_STATIC_GRPC>>,$<LINK_GROUP:RESCAN,${_ddprun_static_grpc_group}>;${_ddprun_static_grpc_system},gRPC::grpc++;protobuf::libprotobuf;absl::synchronization;OpenSSL::SSL;OpenSSL::Crypto>")
else()
  target_link_libraries(ddprun_grpc INTERFACE gRPC::grpc++ protobuf::libprotobuf absl::synchronization OpenSSL::SSL
                        OpenSSL::Crypto)
endif()

# Also defines DDPRUN_GRPC_COMPILED_IN (1 or 0) for the executable's own sources (--version says it).
function(ddprun_link_grpc_statically)
  if(DDPRUN_STATIC_GRPC)
    set_target_properties(${ARGN} PROPERTIES DDPRUN_STATIC_GRPC ON)
  endif()
  foreach(target IN LISTS ARGN)
    target_compile_definitions(${target} PRIVATE DDPRUN_GRPC_COMPILED_IN=$<BOOL:${DDPRUN_STATIC_GRPC}>)
  endforeach()
endfunction()
