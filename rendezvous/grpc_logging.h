// gRPC writes its own errors straight to stderr (for example a lost race to bind a port that
// ddprun then handles). Routing them through spdlog at debug level keeps ddprun's output to one
// clear line per problem; --log_level=debug shows them.
#pragma once

namespace ddprun {

// Idempotent and thread-safe; call before creating a gRPC channel or server.
void routeGrpcLogsToSpdlog();

}  // namespace ddprun
