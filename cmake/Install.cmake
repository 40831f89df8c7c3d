# What `cmake --install`, the .deb (CPack) and the wheel (pyproject.toml) install: docs/install.md.
#
# Components:
#   runtime  the commands: ddprun with ddprun-multinode and ddprun-watchdog beside it (ddprun finds
#            them next to its own executable), and ddprun-rdzv
#   sdk      libddp, shared and static, its public headers, the CMake package ddprun::ddp and
#            ddprun::ddp_static, and ddprun.pc
#   python   the worker API package (python/ddprun), for the .deb (the wheel carries it itself)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(DDPRUN_BIN_DESTINATION ${CMAKE_INSTALL_BINDIR})
if(SKBUILD)
  # The wheel: the binaries become the venv's commands as they are (no Python wrapper in front).
  set(DDPRUN_BIN_DESTINATION ${SKBUILD_SCRIPTS_DIR})
endif()
install(TARGETS ddprun ddprun-multinode ddprun-watchdog ddprun-rdzv RUNTIME DESTINATION ${DDPRUN_BIN_DESTINATION}
        COMPONENT runtime)

# The wheel (DDPRUN_PORTABLE) carries the commands only; libddp comes with the .deb or from source.
if(DDPRUN_PORTABLE)
  return()
endif()

# libddp's objects and the internal libraries it needs, position-independent for libddp.so.
set(DDPRUN_SDK_ARCHIVES ddp ddprun_store_client ddprun_store_etcd ddprun_store_tcpstore_codec ddprun_etcd_client ddprun_rpc ddprun_tls ddprun_proto ddprun_common)
set_target_properties(${DDPRUN_SDK_ARCHIVES} PROPERTIES POSITION_INDEPENDENT_CODE ON)

# libddp.so: every object of libddp (whole archive), the internal libraries as needed; gRPC,
# protobuf, gloo, spdlog (and CUDA/NCCL when built in) stay shared dependencies.
add_library(ddp_shared SHARED worker_sdk/version.h)
set_target_properties(ddp_shared PROPERTIES OUTPUT_NAME ddp VERSION ${PROJECT_VERSION}
                      SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR} LINKER_LANGUAGE CXX
                      LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/lib EXPORT_NAME ddp)
target_link_libraries(ddp_shared PRIVATE "$<LINK_LIBRARY:WHOLE_ARCHIVE,ddp>")
target_include_directories(ddp_shared INTERFACE $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/ddprun>)
target_compile_features(ddp_shared INTERFACE cxx_std_20)

# libddp.a: one archive holding libddp and the internal libraries (ar's MRI script), so that a
# static consumer links -lddp plus the packaged libraries only (ddprunConfig.cmake finds them).
set(_ddp_static ${CMAKE_BINARY_DIR}/lib/libddp.a)
set(_ddp_mri "CREATE ${_ddp_static}\n")
foreach(archive IN LISTS DDPRUN_SDK_ARCHIVES)
  string(APPEND _ddp_mri "ADDLIB $<TARGET_FILE:${archive}>\n")
endforeach()
string(APPEND _ddp_mri "SAVE\nEND\n")
file(GENERATE OUTPUT ${CMAKE_BINARY_DIR}/libddp.mri CONTENT "${_ddp_mri}")
set(_ddp_archive_files)
foreach(archive IN LISTS DDPRUN_SDK_ARCHIVES)
  list(APPEND _ddp_archive_files $<TARGET_FILE:${archive}>)
endforeach()
add_custom_command(OUTPUT ${_ddp_static}
                   COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/lib
                   COMMAND ${CMAKE_COMMAND} -E rm -f ${_ddp_static}
                   COMMAND sh -c "'${CMAKE_AR}' -M < '${CMAKE_BINARY_DIR}/libddp.mri'"
                   DEPENDS ${DDPRUN_SDK_ARCHIVES} ${_ddp_archive_files} ${CMAKE_BINARY_DIR}/libddp.mri
                   COMMENT "libddp.a: libddp with its internal libraries" VERBATIM)
add_custom_target(ddp_static_archive ALL DEPENDS ${_ddp_static})

# The public headers: ddp.h and what it includes (worker_sdk/*.h, standard library only).
set(DDPRUN_SDK_HEADERS communicator.h data_type.h ddp.h env.h gradient_reducer.h heartbeat.h in_process_store.h
    prefix_store.h recovery.h recovery_notice.h remote_store.h staging_buffer.h store.h version.h work.h)
list(TRANSFORM DDPRUN_SDK_HEADERS PREPEND ${PROJECT_SOURCE_DIR}/worker_sdk/)
install(FILES ${DDPRUN_SDK_HEADERS} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ddprun/worker_sdk COMPONENT sdk)
# The errors libddp throws (ddprun::ConfigError, TimeoutError, ...), for a consumer to catch.
install(FILES ${PROJECT_SOURCE_DIR}/common/error.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ddprun/common COMPONENT sdk)
# RemoteStoreOptions' TLS files (standard library only).
install(FILES ${PROJECT_SOURCE_DIR}/tls/tls_options.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ddprun/tls COMPONENT sdk)
install(TARGETS ddp_shared EXPORT ddprunTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT sdk NAMELINK_COMPONENT sdk)
install(FILES ${_ddp_static} DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT sdk)
set(DDPRUN_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/ddprun)
install(EXPORT ddprunTargets NAMESPACE ddprun:: DESTINATION ${DDPRUN_CMAKE_DIR} COMPONENT sdk)
set(DDPRUN_STATIC_EXTRA_LIBS "")
if(DDP_NCCL_FOUND)
  set(DDPRUN_STATIC_EXTRA_LIBS ";CUDA::cudart;${NCCL_LIBRARY}")
endif()
configure_package_config_file(cmake/ddprunConfig.cmake.in ${CMAKE_BINARY_DIR}/ddprunConfig.cmake
                              INSTALL_DESTINATION ${DDPRUN_CMAKE_DIR} PATH_VARS CMAKE_INSTALL_LIBDIR)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/ddprunConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/ddprunConfig.cmake ${CMAKE_BINARY_DIR}/ddprunConfigVersion.cmake
        DESTINATION ${DDPRUN_CMAKE_DIR} COMPONENT sdk)
file(RELATIVE_PATH DDPRUN_PC_TO_PREFIX /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)  # relocatable
configure_file(cmake/ddprun.pc.in ${CMAKE_BINARY_DIR}/ddprun.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/ddprun.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT sdk)

# The worker API for Python, where Debian's python3 finds packages; py.typed tells type checkers
# to use its annotations (PEP 561).
install(DIRECTORY ${PROJECT_SOURCE_DIR}/python/ddprun DESTINATION lib/python3/dist-packages COMPONENT python
        FILES_MATCHING PATTERN "*.py" PATTERN "py.typed")

# The .deb: scripts/package.sh runs `cpack -G DEB` in a Release build without NCCL (the package
# installs on a Debian 12 with no CUDA). Depends from dpkg-shlibdeps, plus python3 for the worker API.
set(CPACK_PACKAGE_NAME ddprun)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "ddprun developers <ddprun@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "torchrun-compatible launcher for distributed data-parallel training")
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "python3")
set(CPACK_DEB_COMPONENT_INSTALL OFF)
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
include(CPack)
