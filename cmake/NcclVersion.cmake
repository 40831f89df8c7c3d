# The NCCL version a header declares, and the oldest libddp's NCCL backend builds against.
# 2.14 introduced what nccl_communicator.cc relies on: non-blocking communicators
# (ncclCommInitRankConfig with ncclConfig_t.blocking = 0, ncclInProgress) and ncclCommFinalize;
# ncclGetLastError (2.13), ncclAvg and ncclBfloat16 (2.10) are older.
set(DDPRUN_NCCL_MIN_VERSION 2.14.0)

# ddprun_nccl_header_version(<nccl.h> <out>): "MAJOR.MINOR.PATCH" from NCCL_MAJOR, NCCL_MINOR and
# NCCL_PATCH, or "" when the header does not define them.
function(ddprun_nccl_header_version header out)
  set(version "")
  if(EXISTS "${header}")
    file(STRINGS "${header}" lines REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
    foreach(part MAJOR MINOR PATCH)
      set(NCCL_${part} "")
      foreach(line ${lines})
        if(line MATCHES "^#define NCCL_${part} +([0-9]+)")
          set(NCCL_${part} ${CMAKE_MATCH_1})
        endif()
      endforeach()
    endforeach()
    if(NOT NCCL_MAJOR STREQUAL "" AND NOT NCCL_MINOR STREQUAL "" AND NOT NCCL_PATCH STREQUAL "")
      set(version "${NCCL_MAJOR}.${NCCL_MINOR}.${NCCL_PATCH}")
    endif()
  endif()
  set(${out} "${version}" PARENT_SCOPE)
endfunction()
