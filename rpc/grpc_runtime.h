// Process-wide settings for gRPC in ddprun's own executables (the agent and ddprun-rdzv), applied
// once before the first channel or server. Not for libddp: it lives in the user's process, whose
// process-wide settings are not ours to change.
#pragma once

#include <string>
#include <vector>

namespace ddprun {

// gRPC and protobuf as this executable has them, for --version (common/build_info.h): compiled in
// (DDPRUN_STATIC_GRPC, per executable) or shared.
std::vector<std::string> grpcLinks(bool compiledIn);

// Idempotent and thread-safe; call before creating a gRPC channel or server.
//  - gRPC writes its own errors straight to stderr (for example a lost race to bind a port that
//    ddprun then handles). They go through spdlog at debug level instead, which keeps ddprun's
//    output to one clear line per problem; --log_level=debug shows them.
//  - Debian builds abseil without NDEBUG, so every absl::Mutex lock inside gRPC records its lock
//    order in one global graph (deadlock detection, a debugging aid): 4-5% of the store server's
//    CPU under load, behind a process-wide lock. It is switched off.
void prepareGrpcRuntime();

}  // namespace ddprun
