// torchrun's error file (TORCHELASTIC_ERROR_FILE), as a worker's @record decorator writes it:
// {"message": {"message": ..., "extraInfo": {"py_callstack": ..., "timestamp": ...}}} or
// {"message": "..."}. Read with Boost.JSON, bounded: the worker may have written anything there.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace ddprun {

struct ErrorFileContent {
  std::string message;
  std::string traceback;
  std::string timestamp;
};

// Bounds on what is read and shown: an error file holds a message and a traceback, not megabytes.
inline constexpr std::size_t kMaxErrorFileBytes = 1 << 20;     // read at most this much
inline constexpr std::size_t kMaxErrorFileDepth = 128;         // JSON nesting
inline constexpr std::size_t kMaxErrorMessageShown = 4096;     // of the message, in the report
inline constexpr std::size_t kMaxTracebackShown = 64 * 1024;   // of the traceback

// nullopt when the file is absent, empty or not a regular file (a FIFO must not block the agent).
// A file that is not torchrun's JSON (invalid, truncated, too deep, larger than the bound, another
// shape) is reported as its raw text. Fields longer than the bounds above are cut, saying by how
// much; control characters other than newline and tab are shown as \xNN. Never throws.
std::optional<ErrorFileContent> readErrorFile(const std::string& path);

// Writes the file as torch's @record would ({"message": {"message", "extraInfo": {"py_callstack",
// "timestamp"}}}): the agent's diagnosis of a rank it killed as hung, which left none itself.
// Written to a temporary name and renamed, so a reader never sees half of it. false on error.
bool writeErrorFile(const std::string& path, const std::string& message, const std::string& traceback);

}  // namespace ddprun
