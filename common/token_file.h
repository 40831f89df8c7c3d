// The job token, read from a file: the one rule for the agent, the worker SDK and ddprun-rdzv.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace ddprun {

// A token is a line of text; a file larger than this is not a token file.
inline constexpr std::size_t kMaxTokenFileBytes = 4096;

// The first line of `path`, without surrounding blanks. Throws ConfigError, naming `what` (how the
// user named the file, such as "--rdzv_conf token_file") and the path but never the content, when
// the file is not a regular file (/dev/zero, a FIFO), cannot be read, is larger than
// kMaxTokenFileBytes, or holds an empty token.
std::string readTokenFile(const std::string& path, std::string_view what);

}  // namespace ddprun
