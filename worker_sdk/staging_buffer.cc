#include "worker_sdk/staging_buffer.h"

#include <string>

#include "common/error.h"

namespace ddp {

const char* toString(MemoryKind kind) { return kind == MemoryKind::kHost ? "host" : "device"; }

void StagingBuffer::copyFromHost(const void* src, std::size_t bytes, std::size_t offset) {
  checkRange("copyFromHost", src, bytes, offset);
  if (bytes > 0) doCopyFromHost(src, bytes, offset);
}

void StagingBuffer::copyToHost(void* dst, std::size_t bytes, std::size_t offset) {
  checkRange("copyToHost", dst, bytes, offset);
  if (bytes > 0) doCopyToHost(dst, bytes, offset);
}

void StagingBuffer::checkRange(const char* what, const void* host, std::size_t bytes, std::size_t offset) const {
  // Written so that offset + bytes cannot overflow.
  if (offset > size_ || bytes > size_ - offset) {
    throw ddprun::ConfigError(std::string("StagingBuffer::") + what + ": bytes [" + std::to_string(offset) + ", " +
                              std::to_string(offset) + " + " + std::to_string(bytes) + ") are outside its " +
                              std::to_string(size_) + " bytes");
  }
  if (bytes > 0 && !host) throw ddprun::ConfigError(std::string("StagingBuffer::") + what + ": null host pointer");
}

}  // namespace ddp
